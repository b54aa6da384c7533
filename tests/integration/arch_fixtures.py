"""The pinned tree's model-fixture generator, for the tests that load its models: the product's own
(lanes/arch_fixtures.py, which `dgr roster` builds and runs), not a copy of it."""

from __future__ import annotations

from lanes.arch_fixtures import ARCHIVES, SOURCE, build_generator, generate

__all__ = ["ARCHIVES", "SOURCE", "build_generator", "generate"]
