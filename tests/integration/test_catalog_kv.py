"""The catalog's KV bytes per token are the workers' own (issue 45): `dgr catalog` over the session's
tiny-llama certification gives, for every stage of every certified placement, the bytes a session's
state grew by per position between two lengths the certification held (the Session RPC after each
prompt); workers started here on the same layers, prefilled to those two lengths, report the same
growth within 1%, and hold the weights the catalog says they do.  tiny-v4's certification test holds
its own entries the same way (test_certify_v4)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.catalog_held import catalog_of, check_entries

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_catalog_kv_bytes_per_token_are_what_workers_hold(
    live_certification, worker_command, stubs, worker_env, tmp_path: Path
) -> None:
    catalog = catalog_of(live_certification().certificate, tmp_path / "catalog.json")
    assert check_entries(catalog, "tiny-llama", worker_command, stubs, worker_env, tmp_path) > 0
