"""The hub test case shared by the hub's test modules: a loopback fake hub and storage host, a set
manifest sealed from it, and the `dgr` entry point run in-process against them."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from core.context import Context
from fetch.download import RetryPolicy
from fetch.provision import Provisioned, provision
from fetch.seal import seal_hub
from tests.fakehub import FakeHub, Storage
from tests.unit.ggufmaker import split_set

CHUNK = 64 << 10
FAST = RetryPolicy(attempts=2, backoff_s=0.0, timeout_s=5.0)
REPO = "org/model-GGUF"
PATHS = ["Q4/model-00001-of-00002.gguf", "Q4/model-00002-of-00002.gguf"]
TOKEN = "hf_test_token"


@dataclass
class HubCase:
    hub: FakeHub
    storage: Storage
    tmp: Path
    env: dict[str, str]
    files: dict[str, bytes]

    @property
    def manifests(self) -> Path:
        return self.tmp / "m" / "artifacts"  # the user's artifacts folder (DGR_MANIFESTS_DIR=tmp/m)

    @property
    def store(self) -> Path:
        return self.tmp / "store"

    def ctx(self, **env: str) -> Context:
        return Context.from_env({**self.env, **env})

    def seal(self, ref: str = f"{REPO}@main", **kw: object) -> tuple[Path, str]:
        kw.setdefault("policy", FAST)
        return seal_hub("hubset", ref, ctx=self.ctx(), root=self.manifests, progress=None, **kw)  # type: ignore[arg-type]

    def provision(self, **kw: object) -> Provisioned:
        kw.setdefault("progress", None)
        return provision(self.ctx(), "hubset", store=self.store, manifests=self.manifests, policy=FAST, **kw)  # type: ignore[arg-type]

    def manifest(self) -> dict:
        return json.loads((self.manifests / "hubset.json").read_text())

    def published(self, name: str) -> Path:
        return self.store / "hubset" / "q4" / name


@contextlib.contextmanager
def hub_case(tmp_path: Path, ctx: Context) -> Iterator[HubCase]:
    """The fake hub serving REPO (two split files under Q4/ and one other file), the storage host it
    redirects to, and an unsealed set manifest naming it; each test module wraps it in its fixture."""
    blobs = split_set(2, [(5 * CHUNK + 1000) // 4 - 40, (3 * CHUNK + 10) // 4 - 40])
    files = {PATHS[0]: blobs[0], PATHS[1]: blobs[1], "other/model-f16.gguf": split_set(1, [100])[0]}
    with Storage() as storage, FakeHub(storage, token=TOKEN) as fake:
        fake.add_repo(REPO, files)
        env = {k: v for k, v in ctx.env.items() if not k.startswith(("HF_", "HUGGING"))}
        env.update(HOME=str(tmp_path / "home"), HF_ENDPOINT=fake.endpoint, HF_TOKEN=TOKEN)
        env.update(DGR_MANIFESTS_DIR=str(tmp_path / "m"))  # where `dgr seal` finds the set
        (tmp_path / "m" / "artifacts").mkdir(parents=True)
        template = {
            "schema_version": 1,
            "name": "hubset",
            "description": "a split GGUF set from the fake hub",
            "storage": "any",
            "origins": [{"kind": "hub", "repo": REPO, "allowed_redirect_hosts": [storage.netloc]}],
            "default_variant": "q4",
            "variants": {
                "q4": {
                    "chunk_size": CHUNK,
                    "chunk_digest": "blake3",
                    "gguf": {"architecture": "llama", "block_count": 1},
                    "files": [],
                }
            },
        }
        (tmp_path / "m" / "artifacts" / "hubset.json").write_text(json.dumps(template))
        yield HubCase(hub=fake, storage=storage, tmp=tmp_path, env=env, files=files)


def run_cli(case: HubCase, monkeypatch: pytest.MonkeyPatch, *argv: str) -> int:
    from cli.main import main

    monkeypatch.setitem(seal_hub.__kwdefaults__, "root", case.manifests)  # never the shipped manifests
    monkeypatch.setitem(seal_hub.__kwdefaults__, "policy", FAST)  # a failure gives up in seconds
    monkeypatch.setitem(provision.__kwdefaults__, "policy", FAST)
    monkeypatch.setitem(provision.__kwdefaults__, "manifests", case.manifests)
    for key in [k for k in os.environ if k.startswith(("HF_", "DGR_"))]:
        monkeypatch.delenv(key)
    for key, value in case.env.items():
        if key.startswith(("HF_", "DGR_")) or key == "HOME":
            monkeypatch.setenv(key, value)
    return main(list(argv))
