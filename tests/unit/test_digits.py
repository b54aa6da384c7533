"""Whole numbers from text we did not write take ASCII digits only (core.digits): '²'.isdigit() is True
and int('²') raises, so each ``isdigit()``-guarded ``int()`` was a traceback where a one-line refusal
belonged."""

from __future__ import annotations

import pytest

from certify.inputs import worker_threads
from core import environment
from core.digits import ascii_int
from core.errors import ConfigurationError
from manifests.placement_file import check_address

NOT_ASCII_DIGITS = ["²", "٣", "１２", "1²"]


@pytest.mark.parametrize(("text", "value"), [("12", 12), (" 7\n", 7), ("0", 0), ("007", 7)])
def test_ascii_digits_are_read(text: str, value: int) -> None:
    assert ascii_int(text) == value


@pytest.mark.parametrize("text", [*NOT_ASCII_DIGITS, "", None, "-1", "+1", "1.0", "1e3", "0x10", "1 2"])
def test_anything_else_is_no_number(text: str | None) -> None:
    assert ascii_int(text) is None


@pytest.mark.parametrize("text", NOT_ASCII_DIGITS)
def test_worker_threads_in_other_digits_is_one_line(text: str) -> None:
    with pytest.raises(ConfigurationError, match="DGR_WORKER_THREADS"):
        environment.check({"DGR_WORKER_THREADS": text})
    with pytest.raises(ConfigurationError, match="not a positive integer"):
        worker_threads({"DGR_WORKER_THREADS": text}, cores=2)


@pytest.mark.parametrize("text", NOT_ASCII_DIGITS)
def test_a_port_in_other_digits_is_refused(text: str) -> None:
    with pytest.raises(ConfigurationError, match="not host:port"):
        check_address(f"10.0.0.7:{text}", "stage 1")


def test_ascii_ports_still_read() -> None:
    assert check_address("10.0.0.7:7001", "stage 1") == "10.0.0.7:7001"
    assert check_address("[fd00::7]:7001", "stage 1") == "[fd00::7]:7001"
