"""Threads per worker for the workers `dgr certify` starts (certify.inputs.worker_threads): the host's
cores shared out among the most stages a placement of the recipe starts on it, never fewer than one,
one count for the whole run; DGR_WORKER_THREADS overrides, and a bad value is a one-line error.

Before, every worker took every core, and the OpenMP teams of idle stages spun on the cores the
computing stage needed (worker/README.md, "Threads")."""

from __future__ import annotations

import pytest

from certify.inputs import worker_threads
from core.errors import ConfigurationError
from manifests.recipe_model import load


def test_the_tiny_recipe_puts_twelve_stages_on_the_host() -> None:
    assert load("tiny-llama", {}).most_stages == 12


@pytest.mark.parametrize(
    ("cores", "stages", "threads"),
    [
        (2, 12, 1),  # more stages than cores: one thread each, not none
        (2, 1, 2),  # the monolithic worker alone: every core
        (16, 2, 8),
        (16, 3, 5),  # what is left over stays idle rather than oversubscribed
        (1, 4, 1),
    ],
)
def test_the_cores_are_shared_out_among_the_stages(cores, stages, threads) -> None:
    assert worker_threads({}, cores, stages) == threads


def test_the_environment_overrides_the_share() -> None:
    assert worker_threads({"DGR_WORKER_THREADS": "3"}, 2, 12) == 3


@pytest.mark.parametrize("raw", ["0", "-1", "two"])
def test_a_bad_override_is_refused(raw) -> None:
    with pytest.raises(ConfigurationError, match=f"DGR_WORKER_THREADS={raw!r} is not a positive integer"):
        worker_threads({"DGR_WORKER_THREADS": raw}, 2, 1)
