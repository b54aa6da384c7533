"""A real ENOSPC for a test: a Python child run with ``folder`` on a small tmpfs mounted in a private
user and mount namespace (the network namespace is shared, so loopback servers stay reachable).

One place for the set-up every disk-full test used to spell out: the skip where ``unshare`` is missing
or the kernel refuses the mount, the mount, the child's interpreter and its environment."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from core.workspace import PROJECT_ROOT


def run_on_full_disk(
    folder: Path, child: str, args: Sequence[str], env: Mapping[str, str], *, size: str = "256k"
) -> subprocess.CompletedProcess[str]:
    """``python -c child *args`` with ``folder`` (made here) on a ``size`` tmpfs; skips the test where
    no namespace or mount can be had."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not available")
    folder.mkdir(parents=True, exist_ok=True)
    script = f'mount -t tmpfs -o size={size} tmpfs "{folder}" && exec "{sys.executable}" -c "$0" "$@"'
    done = subprocess.run(
        ["unshare", "-Urm", "sh", "-c", script, child, *args],
        cwd=PROJECT_ROOT,
        env={**env, "PYTHONPATH": str(PROJECT_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0 and "mount" in done.stderr:
        pytest.skip(f"cannot mount a tmpfs in a user namespace here: {done.stderr.strip()}")
    return done
