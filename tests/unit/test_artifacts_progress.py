"""Progress bars: drawn on a terminal, silent otherwise (CI logs stay clean)."""

from __future__ import annotations

import io

from fetch.progress import Progress, human_bytes


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_quiet_when_the_stream_is_not_a_terminal() -> None:
    out = io.StringIO()
    with Progress("fetch x", 1000, stream=out) as bar:
        bar.update(500)
        bar.update(500)
    assert out.getvalue() == "" and bar.done == 1000


def test_draws_bytes_percentage_and_rate_on_a_terminal() -> None:
    out = Tty()
    with Progress("verify x", 4 << 20, stream=out, interval_s=0.0) as bar:
        bar.update(2 << 20)
    text = out.getvalue()
    assert text.startswith("\rverify x [") and " 50.0% " in text and "2.0 MiB/4.0 MiB" in text
    assert text.endswith("100.0% 2.0 MiB/4.0 MiB " + text.rsplit("MiB ", 1)[-1]) or text.endswith("\n")


def test_human_bytes() -> None:
    assert human_bytes(512) == "512 B" and human_bytes(3 << 30) == "3.0 GiB"
