"""Run `dgr` as a user would (a child `python -m certify`) and read what a certification wrote."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Mapping
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
