"""The one timestamp format the pipeline writes into provenance records (UTC, seconds, ISO 8601)."""

from __future__ import annotations

from datetime import UTC, datetime


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
