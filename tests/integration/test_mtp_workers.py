"""The nextn (MTP) block drafting on the worker's last stage (CPU lane, tiny-v4-mtp, docs/mtp.md).

Workers started with --mtp: the last stage loads the nextn block, catches its MTP context up on every
pass's accepted positions, verifies the pass's drafted tokens and drafts k more after them; the driver
feeds them back (pipeline.speculative.NextnDrafter).  On the monolithic worker and a three-stage cut,
relayed and chained:
- MTP on chooses the tokens MTP off chooses (plain greedy decoding on workers without --mtp);
- the last stage's count of accepted drafts equals the driver's (checked on every pass by the driver);
- rejected drafts leave no trace with the MTP context running (two runs that fed different rejected
  tokens give bitwise the same logits);
- --mtp is refused on a stage that is not the last and on a model without a nextn block, and a
  worker without it refuses to verify or draft.
The acceptance, tokens per pass and crossings per token are printed (a random nextn block accepts
almost nothing; the known-acceptance ceiling is tests/bench/test_bench_speculative.py).
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import numpy as np
import pytest

from fetch.provision import provision
from pipeline import drive, routes, speculative
from tests.integration import test_tiny_v4_mtp_set as mtp_set
from worker.client import StageFailed
from worker.launcher import launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

TEXT = "The quick brown fox jumps over the lazy dog."
N_DECODE = 16
K = 3
mtp_probe = mtp_set.mtp_probe  # the single-process MTP probe, compiled once per module

PLACEMENTS = {"monolithic": [(0, 12)], "3-stages": [(0, 4), (4, 8), (8, 12)]}


@pytest.fixture(scope="module")
def mtp_model(real_ctx) -> Path:
    return Path(provision(real_ctx, "tiny-v4-mtp").first)


def _mtp_command(worker_command, model: Path, *, mtp: bool = False):
    return dataclasses.replace(worker_command, model=model, max_rewind=K, ctx_size=256, mtp=mtp)


@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_mtp_on_chooses_the_tokens_mtp_off_chooses(
    placement, mtp_model, worker_command, stubs, worker_env, tmp_path
) -> None:
    stages = PLACEMENTS[placement]
    plain_cmd = _mtp_command(worker_command, mtp_model)
    with launch(plain_cmd, stages, stubs=stubs, evidence=tmp_path / "off", env=worker_env) as p:
        prompt = p.clients[0].tokenize(TEXT, add_special=True)
        off = drive.run_placement(p.clients, [prompt], N_DECODE, all_logits=False).prompts[0]
        n_vocab = p.clients[-1].info().n_vocab
    with launch(
        dataclasses.replace(plain_cmd, mtp=True),
        stages,
        stubs=stubs,
        evidence=tmp_path / "on",
        env=worker_env,
    ) as p:
        assert p.clients[-1].info().mtp and not any(c.info().mtp for c in p.clients[:-1])
        for forwarding in ("relayed", "chained"):
            got = speculative.run(
                p.clients,
                prompt,
                N_DECODE,
                k=K,
                drafter=speculative.NextnDrafter(),
                route=routes.spec_named(forwarding),
            )
            print(
                f"{placement} {forwarding}: nextn acceptance {got.acceptance_rate:.2f}, "
                f"{got.tokens_per_pass:.2f} tokens/pass, {got.crossings_per_token:.2f} crossings/token"
            )
            assert got.tokens == off.tokens, forwarding
            assert sum(q.drafted for q in got.passes) > 0, "the last stage drafted nothing"
        plain_on = drive.run_placement(p.clients, [prompt], N_DECODE, all_logits=False).prompts[0]
        assert plain_on.tokens == off.tokens and np.array_equal(plain_on.logits, off.logits)
        a, b = (
            speculative.run(
                p.clients,
                prompt,
                N_DECODE,
                k=K,
                drafter=speculative.KnownDrafter(
                    off.tokens, acceptance=0.4, n_vocab=n_vocab, seed=5, wrong_by=by
                ),
            )
            for by in (1, 2)
        )
    assert any(q.rewound for q in a.passes)
    assert np.array_equal(a.logits, b.logits) and a.tokens == b.tokens == off.tokens


def test_the_last_stage_drafts_what_the_nextn_block_predicts(
    mtp_model, mtp_probe, worker_command, stubs, worker_env, tmp_path
) -> None:
    """k = 1: every pass's draft equals the one the pinned library's MTP context gives in one process
    (tests/integration/mtp_last_stage.cpp, the draft-mtp pairing), token for token."""
    threads = str(worker_command.threads)
    argv = [
        str(mtp_probe),
        "-m",
        str(mtp_model),
        "-c",
        "8",
        "-n",
        str(N_DECODE - 1),
        "-t",
        threads,
        "-p",
        TEXT,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    probe = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    expected = [int(t) for t in probe["draft tokens"].split()]
    cmd = _mtp_command(worker_command, mtp_model, mtp=True)
    with launch(cmd, PLACEMENTS["3-stages"], stubs=stubs, evidence=tmp_path, env=worker_env) as p:
        prompt = p.clients[0].tokenize(TEXT, add_special=True)
        drafter = speculative.NextnDrafter()
        got = speculative.run(p.clients, prompt, N_DECODE, k=1, drafter=drafter)
    drafts = [d[0] for d in drafter.history if d]
    print(f"\nworker drafts {drafts}\nprobe drafts  {expected}; accepted {got.acceptance_rate:.2f}")
    assert len(drafts) >= len(expected) > 0
    assert drafts[: len(expected)] == expected


def test_mtp_is_refused_where_it_cannot_run(
    mtp_model, real_ctx, worker_command, stubs, worker_env, tmp_path
) -> None:
    cmd = _mtp_command(worker_command, mtp_model)
    with pytest.raises(StageFailed, match="only the last stage drafts"):
        with launch(
            dataclasses.replace(cmd, extra=("--mtp",)),
            [(0, 4), (4, 12)],
            stubs=stubs,
            evidence=tmp_path / "first",
            env=worker_env,
        ):
            pass
    no_block = Path(provision(real_ctx, "tiny-v4").first)
    with pytest.raises(StageFailed, match="no nextn"):
        with launch(
            dataclasses.replace(cmd, model=no_block, extra=("--mtp",)),
            [(0, 12)],
            stubs=stubs,
            evidence=tmp_path / "no-block",
            env=worker_env,
        ):
            pass
    with launch(cmd, [(0, 12)], stubs=stubs, evidence=tmp_path / "off", env=worker_env) as p:
        session = drive.new_session("nodraft")
        with pytest.raises(StageFailed) as caught:
            p.clients[0].forward(session, 1, [0, 1], tokens=[1, 2], draft=2)
        assert caught.value.code == "FAILED_PRECONDITION" and "--mtp" in caught.value.detail
