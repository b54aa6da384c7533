"""Progress: tqdm's bar on a terminal, plain periodic lines elsewhere (CI logs), silent when disabled."""

from __future__ import annotations

import io

import pytest

from fetch.progress import Progress, factory, human_bytes


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    """A hand-driven monotonic clock: the tests do not depend on how fast the machine is."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_plain_lines_off_a_terminal_one_per_tenth_with_rate_and_eta() -> None:
    out, clock = io.StringIO(), Clock()
    with Progress("fetch x", 1000, stream=out, clock=clock) as bar:
        for _ in range(10):
            clock.now += 2.0  # 100 B every 2 s: 50 B/s
            bar.update(100)
    text = out.getvalue()
    lines = text.splitlines()
    assert "\r" not in text and text.endswith("\n") and bar.done == 1000
    assert len(lines) == 10, lines  # one per tenth; the last one is the end, close adds no repeat
    assert all(line.startswith("fetch x: ") and " elapsed, ETA " in line for line in lines)
    assert lines[4] == "fetch x: 500 B / 1000 B (50%), 50 B/s, 00:10 elapsed, ETA 00:10"
    assert lines[-1] == "fetch x: 1000 B / 1000 B (100%), 50 B/s, 00:20 elapsed, ETA 00:00"


def test_plain_lines_every_30_s_when_a_tenth_takes_longer_and_at_most_one_a_second() -> None:
    out, clock = io.StringIO(), Clock()
    with Progress("fetch big", 10 << 30, stream=out, clock=clock) as bar:
        clock.now += 10
        bar.update(1 << 20)  # 10 s, far from a tenth: no line
        assert out.getvalue() == ""
        clock.now += 21
        bar.update(1 << 20)  # 31 s since the start: a line
        clock.now += 29.5
        bar.update(1 << 20)  # 29.5 s since that line: none yet
        clock.now += 1
        bar.update(1 << 20)  # 30.5 s: the second line
        bar.update(4 << 30)  # past several tenths, but in the same instant: waits for the gap
        assert len(out.getvalue().splitlines()) == 2
        clock.now += 1
        bar.update(1)  # a second later: the tenths already passed show up
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines  # close adds none: the last line already shows the final count
    assert lines[0].startswith("fetch big: 2.0 MiB / 10.0 GiB (0%), ") and "00:31 elapsed" in lines[0]
    assert lines[1].startswith("fetch big: 4.0 MiB / 10.0 GiB (0%), ") and "01:01 elapsed" in lines[1]
    assert lines[2].startswith("fetch big: 4.0 GiB / 10.0 GiB (40%), ") and "01:02 elapsed" in lines[2]


def test_a_small_fast_file_gets_one_line_not_ten() -> None:
    out, clock = io.StringIO(), Clock()
    with Progress("verify small", 4096, stream=out, clock=clock) as bar:
        for _ in range(16):
            bar.update(256)
        clock.now += 0.5
    assert out.getvalue() == "verify small: 4.0 KiB / 4.0 KiB (100%), 8.0 KiB/s, 00:00 elapsed, ETA 00:00\n"


def test_initial_counts_as_done_but_not_in_the_rate() -> None:
    out, clock = io.StringIO(), Clock()
    with Progress("fetch x", 1000, initial=600, stream=out, clock=clock) as bar:
        assert bar.done == 600
        clock.now += 10
        bar.update(100)  # 100 B in 10 s: 10 B/s, not 70; 300 B left: 30 s
    assert bar.done == 700
    assert out.getvalue() == "fetch x: 700 B / 1000 B (70%), 10 B/s, 00:10 elapsed, ETA 00:30\n"


@pytest.mark.parametrize("stream", [io.StringIO, Tty])
def test_a_bar_that_never_moved_prints_nothing(stream: type[io.StringIO]) -> None:
    out = stream()
    with Progress("fetch x", 1000, initial=400, stream=out) as bar:
        bar.update(0)
    assert out.getvalue() == "" and bar.done == 400


@pytest.mark.parametrize("stream", [io.StringIO, Tty])
def test_disabled_writes_nothing(stream: type[io.StringIO]) -> None:
    out = stream()
    with Progress("fetch x", 1000, initial=10, stream=out, enabled=False) as bar:
        bar.update(500)
        bar.update(490)
    assert out.getvalue() == "" and bar.done == 1000


def test_draws_a_tqdm_bar_with_bytes_percentage_and_eta_on_a_terminal() -> None:
    out = Tty()
    with Progress("verify x", 4 << 20, stream=out, interval_s=0.0) as bar:
        bar.update(2 << 20)
    text = out.getvalue()
    assert text.startswith("\rverify x:") and text.endswith("\n") and text.count("\n") == 1
    final = text.rsplit("\r", 1)[-1]
    assert " 50%|" in final and "2.00M/4.00M [" in final and "<" in final and "B/s]" in final


def test_resumed_bytes_show_on_the_terminal_bar() -> None:
    out = Tty()
    with Progress("fetch x", 4 << 20, initial=3 << 20, stream=out, interval_s=0.0) as bar:
        bar.update(1 << 20)
    final = out.getvalue().rsplit("\r", 1)[-1]
    assert "100%|" in final and "4.00M/4.00M [" in final


def test_factory_passes_initial_and_writes_plain_lines_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    with factory()("seal y", 10, initial=4) as bar:
        bar.update(6)
    err = capsys.readouterr().err
    assert err.startswith("seal y: 10 B / 10 B (100%), ") and err.endswith(", ETA 00:00\n")
    assert "\r" not in err and err.count("\n") == 1
    with factory(enabled=False)("seal y", 10, initial=4) as quiet:
        quiet.update(6)
    assert capsys.readouterr().err == "" and quiet.done == 10


def test_human_bytes() -> None:
    assert human_bytes(512) == "512 B" and human_bytes(3 << 30) == "3.0 GiB"
