"""The whole roster (issue 44) as CI runs it: every model the pinned tree's fixture generator writes,
staged by 0002's stage cut at every cut and on four stages, bitwise against the monolithic worker.

What the roster says today is pinned here, so a regression shows as a failure: at least 89 of the 101
generated architectures stage bitwise (90 with minimax-01), and every fixture that does not is one of
those named below, each for its reason. cogvlm stages because its later stages take the token ids
beside the boundary (its builder chooses its weights by whether a batch carries them, which no graph
shows; before, it gave other logits and the roster exited 5). minimax-01 aborts now and then on the
monolithic worker as well (n_head of a layer index past the model, before any stage cut: the same
fixture aborts 1 run in 12 on a worker built without the cut), so it may pass or not, and the exit
status is 5 only when it did not."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import pytest

from tests.integration.dgr_cli import run_dgr, user_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

NOT_BITWISE = {
    "kimi-k3-moe.gguf": "read inp_embd",  # later layers read the embedding
    "minimax-01-moe.gguf": "",  # intermittent abort, also unstaged (see above)
    "nemotron_h-dense.gguf": "names no layer output (l_out)",
    "nemotron_h_moe-dense.gguf": "names no layer output (l_out)",
    "plamo2-dense.gguf": "names no layer output (l_out)",
    "talkie-dense.gguf": "read inp_embd (first stage only)",  # every layer adds the normed embedding
}


def test_every_generated_architecture_stages_bitwise_or_is_named(cpu_build) -> None:
    started = time.monotonic()
    done = run_dgr(user_env(), "roster", timeout=1400)
    lines = done.stdout.splitlines()
    print(f"\n[roster] {lines[-3] if len(lines) > 2 else ''} ({time.monotonic() - started:.0f} s)")
    failed = done.returncode == 5 and "minimax-01-moe.gguf" in done.stderr and "cogvlm" not in done.stderr
    assert done.returncode == 0 or failed, done.stdout[-3000:] + done.stderr
    signed = Path(next(line for line in lines if line.startswith("signed: ")).split(": ", 1)[1])
    predicate = json.loads(base64.b64decode(json.loads(signed.read_text())["payload"]))["predicate"]
    summary = predicate["summary"]
    assert summary["generated"] >= 101 and summary["staged_bitwise"] >= 89, summary
    for row in predicate["rows"]:
        if row["status"] in ("PASS", "not staged", "not generated"):
            assert row["status"] == "PASS" or row["reason"], row
            continue
        name = row["fixture"] or row["architecture"]
        assert name in NOT_BITWISE, f"{name} no longer stages: {row['status']}: {row['reason']}"
        assert NOT_BITWISE[name] in row["reason"], row
