"""Manifest loading: schema validation, unknown keys named with a typo hint, frozen dataclasses."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from core.errors import ConfigurationError
from fetch.source import Pin, SdistPin, load_pin
from manifests.loader import build, load_json

PIN = Path(__file__).resolve().parents[2] / "manifests" / "llama.cpp.json"


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "pin.json"
    path.write_text(json.dumps(data))
    return path


def _pin_data() -> dict:
    return json.loads(PIN.read_text())


def test_the_real_pin_loads_into_frozen_dataclasses() -> None:
    pin = load_pin()
    assert pin.commit == "4df29be4f4c3673f428170fda944a5b19f743bb8"
    assert pin.tree == "5664c498dbf10292801ec319c7d677ec73c562d9"
    assert pin.sources.order == ("git", "sdist")
    assert isinstance(pin.sources.sdist, SdistPin)
    assert pin.sources.sdist.subtree == "vendor/llama.cpp"
    with pytest.raises(dataclasses.FrozenInstanceError):
        pin.commit = "0" * 40  # type: ignore[misc]


def test_unknown_top_level_key_is_named_with_a_typo_hint(tmp_path: Path) -> None:
    data = _pin_data()
    data["comit"] = data.pop("commit")
    with pytest.raises(ConfigurationError) as err:
        load_pin(_write(tmp_path, data))
    assert "unknown key 'comit'" in err.value.message
    assert "did you mean 'commit'" in err.value.message
    assert err.value.exit_code == 2


def test_unknown_nested_key_is_named_with_its_location(tmp_path: Path) -> None:
    data = _pin_data()
    data["sources"]["sdist"]["sha265"] = data["sources"]["sdist"].pop("sha256")
    with pytest.raises(ConfigurationError) as err:
        load_pin(_write(tmp_path, data))
    assert "/sources/sdist" in err.value.message
    assert "did you mean 'sha256'" in err.value.message


@pytest.mark.parametrize("commit", ["4df29be", "4DF29BE4F4C3673F428170FDA944A5B19F743BB8", "g" * 40, 42])
def test_bad_commit_is_rejected(tmp_path: Path, commit: object) -> None:
    data = _pin_data()
    data["commit"] = commit
    with pytest.raises(ConfigurationError) as err:
        load_pin(_write(tmp_path, data))
    assert "/commit" in err.value.message


def test_unknown_source_in_order_is_rejected(tmp_path: Path) -> None:
    data = _pin_data()
    data["sources"]["order"] = ["git", "ftp"]
    with pytest.raises(ConfigurationError, match="/sources/order/1"):
        load_pin(_write(tmp_path, data))


def test_subtree_escaping_the_archive_is_rejected(tmp_path: Path) -> None:
    data = _pin_data()
    data["sources"]["sdist"]["subtree"] = "vendor/../.."
    with pytest.raises(ConfigurationError, match="subtree"):
        load_pin(_write(tmp_path, data))


def test_invalid_json_and_missing_file_are_configuration_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(ConfigurationError, match="not valid JSON"):
        load_json(bad, "llama.cpp")
    with pytest.raises(ConfigurationError, match="does not exist"):
        load_json(tmp_path / "absent.json", "llama.cpp")


def test_build_rejects_a_key_the_dataclass_lacks_with_a_hint() -> None:
    data = _pin_data()
    data["sources"]["sdist"]["max_member"] = 3  # schema would catch it; build must as well
    with pytest.raises(ConfigurationError, match="did you mean 'max_members'"):
        build(Pin, data)


def test_defaults_apply_when_optional_caps_are_absent(tmp_path: Path) -> None:
    data = _pin_data()
    del data["sources"]["sdist"]["max_members"]
    del data["sources"]["sdist"]["max_bytes"]
    pin = load_pin(_write(tmp_path, data))
    assert pin.sources.sdist.max_members > 0 and pin.sources.sdist.max_bytes > 0
