"""Helpers that start the Python fake shard worker (fake_shard_worker.py) through the real launcher."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from core.context import Context
from tests.unit import fake_zygote
from worker import stubs as stubs_mod
from worker.launcher import WorkerCommand

FAKE = Path(__file__).with_name("fake_shard_worker.py")
TOY = {"n_layer": 12, "n_embd": 8, "n_vocab": 40, "seed": 7}


def load_stubs(root: Path) -> stubs_mod.Stubs:
    ctx = Context.from_env({"DGR_WORK": str(root / "work"), "HOME": str(root)})
    return stubs_mod.load(ctx.workspace)


def fake_command(tmp: Path, *, threads: int = 1, ctx_size: int = 256) -> WorkerCommand:
    model = tmp / "toy.json"
    model.write_text(json.dumps(TOY))
    return WorkerCommand(
        program=(sys.executable, os.fspath(FAKE)), model=model, threads=threads, ctx_size=ctx_size
    )


def fake_env(stubs: stubs_mod.Stubs, **faults: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DGR_FAKE_")}
    env["DGR_STUBS_DIR"] = os.fspath(stubs.root)
    env.update(fake_zygote.ensure())
    env.update(faults)
    return env


def running(pid: int) -> bool:
    """True while /proc has a live (not zombie) process with this pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
