"""A pass that fails or is cancelled frees its session on the stages best effort, within
drive.UNWIND_RESET_S a stage: each Reset of the unwinding waited out the call's own deadline (30 s) on a
hung stage, so a SIGTERM'd certification stopped its workers 30 s late (test_certify_sigterm)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline import drive
from tests.unit.fake_stages import fake_command, fake_env, load_stubs
from worker.client import StageClient, StageFailed
from worker.launcher import launch

THREE = [(0, 1), (1, 11), (11, 12)]


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory):
    return load_stubs(tmp_path_factory.mktemp("stubs"))


@pytest.fixture
def reset_deadlines(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, float | None]]:
    """Every Reset the driver makes, as (the stage index, the deadline it gave the call)."""
    made: list[tuple[int, float | None]] = []
    reset = StageClient.reset

    def spy(self: StageClient, session_id: str, *, deadline: float | None = 30.0) -> bool:
        made.append((self.stage, deadline))
        return reset(self, session_id, deadline=deadline)

    monkeypatch.setattr(StageClient, "reset", spy)
    return made


def test_a_hung_stage_is_not_waited_on_as_the_pass_unwinds(stubs, tmp_path: Path, reset_deadlines) -> None:
    faults = fake_env(stubs, DGR_FAKE_FAULT="hang-forward", DGR_FAKE_FAULT_BEGIN="1")
    with launch(
        fake_command(tmp_path), THREE, stubs=stubs, evidence=tmp_path / "ev", env=faults, call_deadline=1.5
    ) as p:
        with pytest.raises(StageFailed, match="DEADLINE_EXCEEDED"):
            drive.run_placement(p.clients, [[1, 5, 9, 2]], 4)
    assert sorted(stage for stage, _ in reset_deadlines) == [0, 1, 2], "one Reset per stage"
    assert all(d is not None and d <= drive.UNWIND_RESET_S for _, d in reset_deadlines), reset_deadlines
