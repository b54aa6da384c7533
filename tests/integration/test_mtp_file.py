"""The nextn block as a file of its own (V4 Flash's layout; docs/mtp.md), on the CPU lane.

The sealed set tiny-v4-mtp-only is the pinned converter's ``--mtp`` layout cut from tiny-v4-mtp
(fetch/mtp_file.py); provisioning regenerates it and holds it to its seal. The last stage of a tiny-v4
pipeline (no block in its files, like V4 Flash's main file) loads it with ``--mtp-model``:
- its tensors are tiny-v4-mtp's bitwise, the trunk's are absent, and it has no ``nextn.embed_tokens``
  (the block embeds with the file's ``token_embd``, as on the real file);
- the drafts the last stage makes are the ones tiny-v4-mtp's last stage makes with ``--mtp`` (the
  same block over the same trunk), and MTP on chooses the tokens MTP off chooses;
- the file's weights are counted in the last stage's ``weight_bytes``;
- ``--mtp-model`` is refused on a stage that is not the last, for a file without a nextn block, and
  for another model's file, each with a one-line reason.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from fetch import source
from fetch.provision import provision
from fetch.tinygguf import import_gguf
from pipeline import drive, routes, speculative
from worker.client import StageFailed
from worker.launcher import launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

TEXT = "The quick brown fox jumps over the lazy dog."
N_DECODE = 16
STAGES = [(0, 4), (4, 8), (8, 12)]


@pytest.fixture(scope="module")
def sets(real_ctx) -> dict[str, Path]:
    """Provisioned: generated into staging and verified against their sealed digests."""
    names = ("tiny-v4", "tiny-v4-mtp", "tiny-v4-mtp-only", "tiny-llama")
    return {name: Path(provision(real_ctx, name).first) for name in names}


def _tensors(first: Path, gguf) -> dict[str, bytes]:
    paths = sorted(first.parent.glob(first.name.replace("00001-of", "*-of")))
    return {t.name: np.array(t.data).tobytes() for path in paths for t in gguf.GGUFReader(path).tensors}


def _command(worker_command, model: Path, **changes):
    return dataclasses.replace(worker_command, model=model, max_rewind=3, ctx_size=256, **changes)


def test_the_mtp_file_is_the_block_cut_from_the_whole_model(real_ctx, sets) -> None:
    gguf = import_gguf(source.ensure_pristine(real_ctx).path)
    whole, cut = _tensors(sets["tiny-v4-mtp"], gguf), _tensors(sets["tiny-v4-mtp-only"], gguf)
    assert all(whole[name] == data for name, data in cut.items())
    assert {n for n in cut if n.startswith("blk.12.")} == {n for n in whole if n.startswith("blk.12.")} - {
        "blk.12.nextn.embed_tokens.weight"
    }
    trunk = {n for n in cut if n.startswith("blk.") and not n.startswith("blk.12.")}
    assert trunk == {f"blk.{i}.ffn_gate_tid2eid.weight" for i in range(3)}
    assert "token_embd.weight" in cut and "output.weight" in cut


def _drafts(p, prompt: list[int]) -> tuple[list[int], tuple[int, ...]]:
    drafter = speculative.NextnDrafter()
    got = speculative.run(p.clients, prompt, N_DECODE, k=1, drafter=drafter)
    return [d[0] for d in drafter.history if d], got.tokens


def test_the_last_stage_drafts_from_the_mtp_file_what_the_whole_model_drafts(
    sets, worker_command, stubs, worker_env, tmp_path
) -> None:
    with launch(
        _command(worker_command, sets["tiny-v4-mtp"], mtp=True),
        STAGES,
        stubs=stubs,
        evidence=tmp_path / "in-file",
        env=worker_env,
    ) as p:
        prompt = p.clients[0].tokenize(TEXT, add_special=True)
        in_file, _ = _drafts(p, prompt)
    with launch(
        _command(worker_command, sets["tiny-v4"]),
        STAGES,
        stubs=stubs,
        evidence=tmp_path / "off",
        env=worker_env,
    ) as p:
        off = drive.run_placement(p.clients, [prompt], N_DECODE, all_logits=False).prompts[0]
        plain_bytes = p.clients[-1].info().memory.weight_bytes
    cmd = _command(worker_command, sets["tiny-v4"], mtp=True, mtp_model=sets["tiny-v4-mtp-only"])
    with launch(cmd, STAGES, stubs=stubs, evidence=tmp_path / "own-file", env=worker_env) as p:
        info = p.clients[-1].info()
        assert info.mtp and not any(c.info().mtp for c in p.clients[:-1])
        assert info.memory.weight_bytes > plain_bytes
        own_file, tokens = _drafts(p, prompt)
        for forwarding in ("relayed", "chained"):
            got = speculative.run(
                p.clients,
                prompt,
                N_DECODE,
                k=3,
                drafter=speculative.NextnDrafter(),
                route=routes.spec_named(forwarding),
            )
            assert got.tokens == off.tokens, forwarding
    print(f"\ndrafts from the main file {in_file}\ndrafts from the MTP file  {own_file}")
    assert len(own_file) >= N_DECODE - 1 and own_file == in_file
    assert tokens == off.tokens


@pytest.mark.parametrize(
    "case, stages, mtp_file, expect",
    [
        ("not the last stage", [(0, 4), (4, 12)], "tiny-v4-mtp-only", "only the last stage drafts"),
        ("no block in the file", [(0, 12)], "tiny-v4", "holds no nextn"),
        ("another model's file", [(0, 12)], "tiny-llama", "is not this model's MTP file: architecture"),
    ],
)
def test_the_mtp_file_is_refused_where_it_cannot_run(
    case, stages, mtp_file, expect, sets, worker_command, stubs, worker_env, tmp_path
) -> None:
    # --mtp-model on every stage's command line, so a first stage sees it too
    cmd = _command(worker_command, sets["tiny-v4"], extra=("--mtp-model", str(sets[mtp_file])))
    with pytest.raises(StageFailed, match=expect):
        with launch(cmd, stages, stubs=stubs, evidence=tmp_path, env=worker_env):
            pass
