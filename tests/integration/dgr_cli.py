"""Run `dgr` as a user would (a child `python -m certify`) and read what a certification wrote."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.workspace import PROJECT_ROOT


def user_env(*also_drop: str) -> dict[str, str]:
    """This environment as a user's shell would have it: without a test's own recipe folder or
    signing key (and whatever else ``also_drop`` names)."""
    drop = ("DGR_RECIPES_DIR", "DGR_SIGNING_KEY", *also_drop)
    return {k: v for k, v in os.environ.items() if k not in drop}


def run_dgr(env: Mapping[str, str], *args: str, timeout: float = 2400) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "certify", *args],
        cwd=PROJECT_ROOT,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def certify_pass_and_verify(
    env: Mapping[str, str], recipe: str, lane: str = "cpu"
) -> tuple[Path, dict[str, Any]]:
    """`dgr certify` must end PASS and `dgr verify` must accept its certificate.

    Returns the certificate path (the report sits beside it) and the decoded predicate.
    """
    done = run_dgr(env, "certify", "--recipe", recipe, "--lane", lane)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verdict: PASS" in done.stdout
    cert = Path(
        next(ln.split(": ", 1)[1] for ln in done.stdout.splitlines() if ln.startswith("certificate: "))
    )
    check = run_dgr(env, "verify", str(cert))
    assert check.returncode == 0 and "verdict PASS" in check.stdout, check.stdout + check.stderr
    return cert, json.loads(base64.b64decode(json.loads(cert.read_text())["payload"]))["predicate"]


@dataclass(frozen=True, kw_only=True)
class Certified:
    """One `dgr certify` run and what it wrote."""

    done: subprocess.CompletedProcess[str]
    wall_s: float
    certificate: Path
    report: Path
    predicate: dict[str, Any]
    record: dict[str, Any]  # the run's run.json


def certified(env: Mapping[str, str], *args: str) -> Certified:
    """`dgr certify ARGS` must end with a certificate (PASS or a signed FAIL); returns what it wrote."""
    started = time.monotonic()
    done = run_dgr(env, "certify", *args)
    wall = time.monotonic() - started
    assert done.returncode in (0, 5), done.stdout + done.stderr
    paths = {k: Path(v.strip()) for k, _, v in (ln.partition(": ") for ln in done.stdout.splitlines())
             if k in ("certificate", "report")}
    cert = paths["certificate"]
    predicate = json.loads(base64.b64decode(json.loads(cert.read_text())["payload"]))["predicate"]
    record = json.loads((Path(predicate["evidence"]) / "run.json").read_text())
    return Certified(done=done, wall_s=wall, certificate=cert, report=paths["report"], predicate=predicate,
                     record=record)
