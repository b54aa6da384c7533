"""What every command gets: the environment as a mapping (tests pass their own) and the workspace."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from core import environment
from core.workspace import Workspace


@dataclass(frozen=True, kw_only=True)
class Context:
    env: Mapping[str, str]
    workspace: Workspace

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Context:
        env = dict(os.environ if env is None else env)
        environment.check(env)
        return cls(env=env, workspace=Workspace.from_env(env))
