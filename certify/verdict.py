"""Explicit outcomes: every step and gate yields a Result; the verdict is their reduction."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


class Status(enum.StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"  # a gate measured something outside its threshold
    ERROR = "ERROR"  # the step could not run to the end (worker died, timeout)
    SKIPPED = "SKIPPED"  # not run, with a stated reason (never counted as a pass of a gate)


@dataclass(frozen=True, kw_only=True)
class Result:
    name: str
    status: Status
    reason: str = ""
    duration_s: float = 0.0
    details: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status.value,
            "reason": self.reason,
            "duration_s": round(self.duration_s, 6),
            "details": dict(self.details),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Result:
        return cls(
            name=data["name"],
            status=Status(data["status"]),
            reason=data.get("reason", ""),
            duration_s=float(data.get("duration_s", 0.0)),
            details=dict(data.get("details", {})),
        )


@dataclass(frozen=True, kw_only=True)
class Verdict:
    status: Status
    reasons: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return self.status is Status.PASS

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status.value, "reasons": list(self.reasons)}


def decide(results: Iterable[Result]) -> Verdict:
    """PASS only when every result passed or was an explicitly allowed skip; ERROR beats FAIL
    (an incomplete run says nothing about the gates), and every failing reason is kept."""
    results = list(results)
    if not results:
        return Verdict(status=Status.ERROR, reasons=("no results were produced",))
    errors = [f"{r.name}: {r.reason}" for r in results if r.status is Status.ERROR]
    fails = [f"{r.name}: {r.reason}" for r in results if r.status is Status.FAIL]
    if errors:
        return Verdict(status=Status.ERROR, reasons=tuple(errors + fails))
    if fails:
        return Verdict(status=Status.FAIL, reasons=tuple(fails))
    return Verdict(status=Status.PASS, reasons=())
