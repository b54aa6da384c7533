"""The slow suite's longest tests lead its collection under pytest-xdist (issue 39): xdist hands out
single tests in collection order, and the 470 s lavapipe test, collected near the end, ran alone at
the end of the run."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.integration.conftest import LONGEST_FIRST, longest_first

INTEGRATION = Path(__file__).resolve().parents[1] / "integration"


@dataclass
class Item:
    nodeid: str


def test_the_listed_tests_come_first_longest_first_and_the_rest_keep_their_order() -> None:
    items = [
        Item("tests/integration/test_a.py::test_one"),
        Item("tests/integration/test_certify_e2e.py::test_default_certify_passes_and_verifies"),
        Item("tests/integration/test_b.py::test_two"),
        Item(
            "tests/integration/test_vulkan_lane.py::test_vulkan_workers_on_lavapipe_match_the_cpu_reference"
        ),
        Item("tests/integration/test_a.py::test_three"),
    ]
    longest_first(items)
    assert [i.nodeid.split("::")[1] for i in items] == [
        "test_vulkan_workers_on_lavapipe_match_the_cpu_reference",
        "test_default_certify_passes_and_verifies",
        "test_one",
        "test_two",
        "test_three",
    ]


def test_every_listed_test_exists() -> None:
    """A renamed test would silently lose its place at the front."""
    for nodeid in LONGEST_FIRST:
        path, name = nodeid.split("::")
        function = re.sub(r"\[.*\]$", "", name)
        source = (INTEGRATION / path).read_text()
        assert f"def {function}(" in source, nodeid
