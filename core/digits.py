"""Whole numbers read from text we did not write: environment variables, headers, files, a worker's
trailers, a tool's output.

``str.isdigit`` is True for digits of any script and for superscripts ('²', '٣'), which ``int`` then
refuses or reads as a value the writer never meant; a guard of ``isdigit()`` before ``int()`` turned such
input into a ValueError traceback instead of the one-line refusal each caller has.  Here only ASCII
digits count.
"""

from __future__ import annotations

import re

_DIGITS = re.compile(r"[0-9]+")


def ascii_int(text: str | None) -> int | None:
    """``text`` (surrounding space ignored) as a non-negative int when it is ASCII digits only, else None."""
    stripped = (text or "").strip()
    return int(stripped) if _DIGITS.fullmatch(stripped) else None
