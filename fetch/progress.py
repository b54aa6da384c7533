"""A tiny progress bar on stderr for bytes and for hashing; silent when stderr is not a terminal.

No dependency: one line redrawn with a carriage return at most ten times a second, so a 160 GiB
download does not spend its time printing.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def human_bytes(n: float) -> str:
    for unit in _UNITS:
        if abs(n) < 1024 or unit == _UNITS[-1]:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


class Progress:
    """``with Progress("download x", total) as bar: bar.update(n)``."""

    def __init__(
        self,
        label: str,
        total: int,
        *,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        interval_s: float = 0.1,
    ) -> None:
        self.label = label
        self.total = max(int(total), 0)
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self.interval_s = interval_s
        self._started = time.monotonic()
        self._drawn = 0.0

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: int) -> None:
        self.done += n
        if self.enabled:
            now = time.monotonic()
            if now - self._drawn >= self.interval_s:
                self._drawn = now
                self._draw(now)

    def _draw(self, now: float) -> None:
        width = 24
        frac = min(self.done / self.total, 1.0) if self.total else 1.0
        filled = int(frac * width)
        rate = self.done / max(now - self._started, 1e-9)
        line = (
            f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {frac * 100:5.1f}% "
            f"{human_bytes(self.done)}/{human_bytes(self.total)} {human_bytes(rate)}/s "
        )
        self.stream.write(line)
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.done:  # a bar that never moved (nothing to re-check) leaves no line
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()
            self.enabled = False


def factory(enabled: bool | None = None):
    """A callable ``(label, total) -> Progress``; ``enabled=None`` means 'when stderr is a TTY'."""

    def make(label: str, total: int) -> Progress:
        return Progress(label, total, enabled=enabled)

    return make
