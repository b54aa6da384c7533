"""Issue 20 item 10: the workspace dev key is written to a temp file and linked into place, so it is whole
or absent: concurrent first runs agree on one key, and a 0-byte key left by a killed older run heals."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from certify import keys
from core.context import Context
from core.workspace import PROJECT_ROOT

FIRST_RUN = """
import os, sys, time
from pathlib import Path
from core.context import Context
from certify.keys import dev_key
go = Path(sys.argv[1])
while not go.exists():
    time.sleep(0.001)
print(dev_key(Context.from_env().workspace).keyid)
"""


def test_concurrent_first_runs_get_one_whole_key(ctx: Context, tmp_path: Path) -> None:
    go = tmp_path / "go"
    env = {**ctx.env, "PYTHONPATH": str(PROJECT_ROOT)}
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", FIRST_RUN, str(go)],
            cwd=PROJECT_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    time.sleep(1.0)  # every child imported and spinning
    go.touch()
    results = [r.communicate(timeout=60) for r in runs]
    assert all(r.returncode == 0 for r in runs), [err for _, err in results]
    ids = {out.strip() for out, _ in results}
    assert len(ids) == 1
    key = keys.dev_key(ctx.workspace)
    assert ids == {key.keyid} and key.path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in ctx.workspace.keys.iterdir() if p.name.endswith(".tmp")] == []


def test_a_zero_byte_key_left_by_a_kill_is_replaced(ctx: Context) -> None:
    ctx.workspace.ensure(ctx.workspace.keys)
    path = ctx.workspace.keys / keys.DEV_KEY_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # what the old code left on kill -9
    os.close(fd)
    key = keys.dev_key(ctx.workspace)
    assert path.stat().st_size > 0 and keys.dev_key(ctx.workspace).keyid == key.keyid


def test_an_existing_key_is_never_replaced(ctx: Context) -> None:
    first = keys.dev_key(ctx.workspace)
    before = first.path.read_bytes()
    keys._create_dev_key(first.path)  # a racing second creator loses: the link does not replace
    assert first.path.read_bytes() == before and keys.dev_key(ctx.workspace).keyid == first.keyid
