"""What a session holds, as the worker says it (the Session RPC, issue 45): its positions and its state's
bytes as llama would save them.  On the tiny model (plain attention, one KV row per position and owned
layer) the bytes grow by the same amount for every position, that amount follows the stage's layer
count, and it is the KV buffer's own bytes per position (Info's kv_bytes / n_ctx) plus the few bytes
llama keeps per cell; an unknown or reset session is NOT_FOUND, naming it."""

from __future__ import annotations

import numpy as np
import pytest

from worker.client import StageFailed
from worker.launcher import launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TWO = [(0, 4), (4, 12)]  # 4 and 8 layers: the per-position bytes must follow the layer count
LENGTHS = (8, 24, 56)
CELL_METADATA_BYTES = 16  # llama's per-cell record in a saved state: position and sequence ids


def _prefill(clients, session: str, length: int) -> None:
    tokens = [int(t) for t in np.random.default_rng(length).integers(1, 200, size=length)]
    out = clients[0].forward(session, 1, range(length), tokens=tokens)
    clients[1].forward(session, 1, range(length), boundary=out.boundary_wire)


def test_state_bytes_grow_by_the_kv_bytes_of_each_position(
    worker_command, stubs, worker_env, tmp_path
) -> None:
    with launch(worker_command, TWO, stubs=stubs, evidence=tmp_path / "ev", env=worker_env) as p:
        infos = [c.info() for c in p.clients]
        held = {}
        for length in LENGTHS:
            _prefill(p.clients, f"s{length}", length)
            held[length] = [c.session(f"s{length}") for c in p.clients]
        assert p.clients[1].reset(f"s{LENGTHS[0]}")
        with pytest.raises(StageFailed, match=f"NOT_FOUND.*unknown session 's{LENGTHS[0]}'"):
            p.clients[1].session(f"s{LENGTHS[0]}")
        with pytest.raises(StageFailed, match="NOT_FOUND.*unknown session 'never'"):
            p.clients[0].session("never")
    per_position = []
    for k, info in enumerate(infos):
        figures = [held[n][k] for n in LENGTHS]
        assert [f.n_past for f in figures] == list(LENGTHS) and {f.epoch for f in figures} == {1}
        bytes_at = [f.state_bytes for f in figures]
        slopes = {
            (bytes_at[i + 1] - bytes_at[i]) / (LENGTHS[i + 1] - LENGTHS[i]) for i in range(len(LENGTHS) - 1)
        }
        assert len(slopes) == 1, f"stage {k}: not one amount per position: {slopes}"
        slope = slopes.pop()
        allocated = info.memory.kv_bytes / info.n_ctx
        print(
            f"\n[session] stage {k} ({info.layer_end - info.layer_begin} layers): {slope:.1f} bytes per "
            f"position held, KV buffer {allocated:.1f} per position of n_ctx {info.n_ctx}"
        )
        assert allocated <= slope <= allocated + CELL_METADATA_BYTES, k
        per_position.append(slope - CELL_METADATA_BYTES)
    layers = [info.layer_end - info.layer_begin for info in infos]
    assert per_position[1] / per_position[0] == pytest.approx(layers[1] / layers[0], rel=0.05)
