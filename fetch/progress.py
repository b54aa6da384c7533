"""Progress for bytes (fetch, recheck, verify, seal) on stderr, built on tqdm.

On a terminal: tqdm's bar, redrawn in place at most ten times a second, with size, rate and ETA.
Anywhere else (a CI log, a pipe): plain lines, never a carriage return. A line is written when another
tenth of the total is done (but at most one a second, so a small file hashed in milliseconds gets one
line, not ten), or when 30 s have passed since the last one (a tenth of 160 GiB can take minutes), and
once at the end; each says label, done/total, percent, rate, elapsed time and ETA.

``initial`` is what was already verified on disk before this run: it counts as done but not in the
rate, so the ETA of a resumed download is what is left at this run's speed. A bar that never moved
(``initial`` alone is no movement) prints nothing; ``enabled=False`` prints nothing at all.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from tqdm import tqdm

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
PLAIN_STEP = 0.1  # a plain line for every tenth of the total ...
PLAIN_MIN_GAP_S = 1.0  # ... at most one a second ...
PLAIN_EVERY_S = 30.0  # ... and one at least every 30 s while bytes move


def human_bytes(n: float) -> str:
    for unit in _UNITS:
        if abs(n) < 1024 or unit == _UNITS[-1]:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


class Progress:
    """``with Progress("fetch x", total, initial=on_disk) as bar: bar.update(n)``.

    ``clock`` (monotonic seconds) times the plain lines and the rate; tests pass their own.
    """

    def __init__(
        self,
        label: str,
        total: int,
        *,
        initial: int = 0,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        interval_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.total = max(int(total), 0)
        self.initial = self.done = max(int(initial), 0)
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled is not False
        isatty = getattr(self.stream, "isatty", None)
        self.terminal = bool(isatty and isatty())
        self.interval_s = interval_s
        self._clock = clock
        self._started = self._last_line = clock()
        self._next_step = self._step_after(self.done)
        self._shown = self.done  # plain lines: the count the last line showed
        self._bar: tqdm | None = None  # made on the first movement, so a bar that never moves prints nothing

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: int) -> None:
        self.done += n
        if not self.enabled or n <= 0:
            return
        if self.terminal:
            self._tqdm(self.done - n).update(n)
            return
        now = self._clock()
        since = now - self._last_line
        if (self.done >= self._next_step and since >= PLAIN_MIN_GAP_S) or since >= PLAIN_EVERY_S:
            self._line(now)

    def close(self) -> None:
        if not self.enabled:
            return
        self.enabled = False
        if self._bar is not None:
            self._bar.close()  # draws the final state and ends the line
        elif not self.terminal and self.done != self._shown:
            self._line(self._clock())

    def _tqdm(self, before: int) -> tqdm:
        if self._bar is None:
            self._bar = tqdm(
                desc=self.label,
                total=self.total,
                initial=before,
                file=self.stream,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                mininterval=self.interval_s,
                leave=True,
                dynamic_ncols=True,
            )
            # The bar starts when the work did (a hash reports its first slice only once it is done).
            waited = self._clock() - self._started
            self._bar.start_t -= waited
            self._bar.last_print_t -= waited
        return self._bar

    def _step_after(self, done: int) -> float:
        step = max(self.total * PLAIN_STEP, 1.0)
        return (done // step + 1) * step if self.total else float("inf")

    def _line(self, now: float) -> None:
        elapsed = now - self._started
        rate = (self.done - self.initial) / elapsed if elapsed > 0 else None
        left = max(self.total - self.done, 0)
        if self.total and not left:
            eta = tqdm.format_interval(0)
        elif self.total and rate:
            eta = tqdm.format_interval(left / rate)
        else:
            eta = "?"
        percent = f" ({100 * min(self.done / self.total, 1.0):.0f}%)" if self.total else ""
        speed = f"{human_bytes(rate)}/s" if rate is not None else "? B/s"
        self.stream.write(
            f"{self.label}: {human_bytes(self.done)} / {human_bytes(self.total)}{percent}, {speed}, "
            f"{tqdm.format_interval(elapsed)} elapsed, ETA {eta}\n"
        )
        self.stream.flush()
        self._last_line, self._shown = now, self.done
        self._next_step = self._step_after(self.done)


def factory(enabled: bool | None = None) -> Callable[..., Progress]:
    """A callable ``(label, total, initial=0) -> Progress`` on stderr.

    ``enabled=None`` (or True): a bar on a terminal, plain lines elsewhere; ``False``: silent.
    """

    def make(label: str, total: int, initial: int = 0) -> Progress:
        return Progress(label, total, initial=initial, enabled=enabled)

    return make
