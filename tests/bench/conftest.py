"""The benches' fixtures: the slow suite's session fixtures (tests/integration/conftest.py) — the
CPU build, the provisioned tiny model and gemma3-270m-q4, the stubs, the worker command and
environment — shared here once instead of aliased in every bench module."""

from tests.integration.conftest import (  # noqa: F401 (pytest finds fixtures by name)
    cpu_build,
    gemma_store,
    real_ctx,
    stubs,
    tiny_model,
    worker_command,
    worker_env,
)
