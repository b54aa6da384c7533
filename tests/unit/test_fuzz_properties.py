"""Property tests over the parsers of untrusted input (issue 20 item 18): every input either parses or
is refused with the project's typed error (a DgrError), never another exception.  Bounded budget for the
fast suite (DGR_FUZZ_EXAMPLES per strategy and target); the coverage-guided runs are `nox -s fuzz`."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz import seeds as seed_inputs
from tests.fuzz import targets

EXAMPLES = int(os.environ.get("DGR_FUZZ_EXAMPLES", "150"))
BUDGET = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
NAMES = list(targets.TARGETS)
TRIED: dict[str, int] = {}


def _feed(name: str, data: bytes) -> None:
    TRIED[name] = TRIED.get(name, 0) + 1
    targets.run_one(name, data)  # a DgrError is an answer; anything else fails the test


def _apply(seed: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    """Byte edits as a fuzzer makes them: (kind, position, byte) flip / insert / delete / truncate."""
    out = bytearray(seed)
    for kind, pos, byte in edits:
        at = pos % (len(out) + 1)
        if kind == 0 and at < len(out):
            out[at] ^= 1 << (byte % 8)
        elif kind == 1:
            out[at:at] = bytes([byte])
        elif kind == 2 and at < len(out):
            del out[at]
        elif kind == 3:
            del out[at:]
        elif kind == 4 and at < len(out):
            out[at] = byte  # an interesting value: 0, 0xff, a digit, a quote
    return bytes(out)


EDITS = st.lists(
    st.tuples(
        st.integers(0, 4),
        st.integers(0, 1 << 20),
        st.sampled_from(
            [
                0,
                1,
                0x7F,
                0x80,
                0xFF,
                ord("0"),
                ord("9"),
                ord('"'),
                ord("-"),
                ord("\n"),
                ord("/"),
                ord("."),
                ord("["),
                ord("{"),
            ]
        ),
    ),
    min_size=1,
    max_size=12,
)

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _replace(doc: Any, path: tuple, value: Any, delete: bool) -> Any:
    if not path:
        return value
    doc = json.loads(json.dumps(doc))
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


@pytest.mark.parametrize("name", NAMES)
def test_every_seed_parses_or_raises_a_typed_error(name: str) -> None:
    """The seeds as they are, before any mutation: the valid ones parse, the hostile shapes (each a
    traceback once: lone surrogates, whole-number floats, invalid UTF-8) are refused with a DgrError."""
    for data in seed_inputs.seeds(name):
        _feed(name, data)
    for data in seed_inputs.hostile(name):
        assert targets.run_one(name, data) is False, data[:80]


def test_the_manifest_and_series_targets_carry_round_three_shapes() -> None:
    assert {"json", "recipe", "artifact_set", "series"} <= {n for n in NAMES if seed_inputs.hostile(n)}


@pytest.mark.parametrize("name", NAMES)
@BUDGET
@given(data=st.binary(max_size=2048))
def test_random_bytes_parse_or_raise_a_typed_error(name: str, data: bytes) -> None:
    _feed(name, data)


@pytest.mark.parametrize("name", NAMES)
@BUDGET
@given(pick=st.integers(0, 7), edits=EDITS)
def test_mutated_valid_inputs_parse_or_raise_a_typed_error(name: str, pick: int, edits: list) -> None:
    pool = seed_inputs.seeds(name)
    _feed(name, _apply(pool[pick % len(pool)], edits))


@pytest.mark.parametrize("name", ["json", "recipe", "artifact_set", "hub_api"])
@BUDGET
@given(data=st.data(), value=JSON_VALUES, delete=st.booleans())
def test_documents_with_one_value_changed_parse_or_raise_a_typed_error(
    name: str, data: st.DataObject, value: Any, delete: bool
) -> None:
    doc = json.loads(seed_inputs.seeds(name)[0])
    paths = _paths(doc)
    path = data.draw(st.sampled_from(paths))
    _feed(name, json.dumps(_replace(doc, path, value, delete and bool(path))).encode())


@pytest.mark.parametrize("shape", sorted(seed_inputs.HOSTILE_HUB_ANSWERS))
def test_each_hostile_hub_answer_is_refused_with_a_typed_error(shape: str) -> None:
    """Round three's shapes (a size that is not a plain integer, a path both a file and a folder,
    100,000-deep nesting, ...): refused by both readers, never parsed and never another exception."""
    assert targets.run_one("hub_api", seed_inputs.HOSTILE_HUB_ANSWERS[shape][1]) is False


def test_the_hub_api_target_parses_what_the_hub_writes() -> None:
    valid_tree = seed_inputs.seeds("hub_api")[0]
    assert targets.run_one("hub_api", valid_tree) is True


def test_inputs_tried_per_target(capsys: pytest.CaptureFixture[str]) -> None:
    """Runs last in this module: says how many inputs each target took (0 when run alone)."""
    with capsys.disabled():
        print("\n[fuzz-properties] inputs tried: " + ", ".join(f"{n} {TRIED.get(n, 0)}" for n in NAMES))
