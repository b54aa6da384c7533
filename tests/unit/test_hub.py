"""Issue 16: a Hugging Face Hub origin, against a loopback fake hub and a second loopback storage host.

Sealing from the hub (a branch resolved once to its commit, one download per file, sha256 held to the
hub's metadata, GGUF headers checked), provisioning from it with the storage host killed halfway (the
re-run resumes from the last verified chunk), the token reaching the hub host only, a gated repo
without a token, 429 with Retry-After, a proxy.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.context import Context
from core.errors import ConfigurationError, IntegrityError, RuntimeFailure
from fetch import hub
from fetch.seal import seal_hub
from manifests.artifact_sets import load_set
from tests.fakehub import Proxy
from tests.unit.hubcase import CHUNK, FAST, PATHS, REPO, TOKEN, HubCase, hub_case, run_cli


@pytest.fixture
def case(tmp_path: Path, ctx: Context) -> Iterator[HubCase]:
    with hub_case(tmp_path, ctx) as made:
        yield made


def _sealed(case: HubCase) -> str:
    _path, commit = case.seal(include=["Q4/*.gguf"])
    return commit


def test_seal_resolves_the_branch_once_and_records_the_commit(case: HubCase) -> None:
    path, commit = case.seal(include=["Q4/*.gguf"])
    assert commit == case.hub.repos[REPO].commit and hub.COMMIT.match(commit)
    data = case.manifest()
    origin = data["origins"][0]
    assert origin["revision"] == commit and origin["paths"] == PATHS
    files = data["variants"]["q4"]["files"]
    assert [f["name"] for f in files] == PATHS
    for f in files:
        blob = case.files[f["name"]]
        assert f["size"] == len(blob) and f["sha256"] == hashlib.sha256(blob).hexdigest()
        assert len(f["chunks"]) == -(-len(blob) // CHUNK)
    assert data["variants"]["q4"]["gguf"]["split_count"] == 2
    revision_calls = [s for s in case.hub.seen if "/revision/" in s.path]
    assert [s.path for s in revision_calls] == [f"/api/models/{REPO}/revision/main"]
    assert any(s.path == f"/api/models/{REPO}/tree/{commit}?recursive=true" for s in case.hub.seen)
    # one download per file, each resolved at the commit, never at the branch
    resolves = [s.path for s in case.hub.seen if "/resolve/" in s.path]
    assert resolves == [f"/{REPO}/resolve/{commit}/{p}" for p in PATHS]
    assert case.storage.sent == sum(len(case.files[p]) for p in PATHS)
    assert TOKEN not in path.read_text()
    assert load_set("hubset", root=case.manifests).variant("q4").sealed


def test_provision_with_storage_killed_halfway_resumes_from_the_last_verified_chunk(
    case: HubCase, caplog: pytest.LogCaptureFixture
) -> None:
    _sealed(case)
    first, second = (case.files[p] for p in PATHS)
    case.storage.sent = 0
    case.storage.seen.clear()
    case.storage.kill_after = len(first) + 2 * CHUNK + CHUNK // 2  # mid-chunk 2 of the second file
    with pytest.raises(RuntimeFailure, match=f"incomplete {2 * CHUNK} of {len(second)} bytes") as caught:
        case.provision()
    said = caught.value.one_line() + caplog.text
    assert "Signature" not in said and TOKEN not in said  # the storage URL's query is not shown
    assert case.published(PATHS[0]).read_bytes() == first
    assert not case.published(PATHS[1]).exists()
    first_run = case.storage.sent
    case.storage.restart()
    case.storage.sent = 0
    case.storage.seen.clear()
    done = case.provision()
    assert [p.read_bytes() for p in done.files] == [first, second]  # the hub's bytes, in split order
    assert [s.headers.get("Range") for s in case.storage.seen] == [f"bytes={2 * CHUNK}-{len(second) - 1}"]
    assert case.storage.sent == len(second) - 2 * CHUNK == done.bytes_fetched
    assert first_run + case.storage.sent - len(first) - len(second) <= CHUNK  # at most one chunk again
    assert done.reused == 1


def test_token_reaches_the_hub_host_and_never_the_storage_host(case: HubCase) -> None:
    _sealed(case)
    case.provision()
    assert case.hub.seen and all(s.headers.get("Authorization") == f"Bearer {TOKEN}" for s in case.hub.seen)
    assert case.storage.seen  # same address, another port: another host
    assert all("Authorization" not in s.headers for s in case.storage.seen)
    assert all(TOKEN not in json.dumps(s.headers) + s.path for s in case.storage.seen)
    prov = next(case.store.rglob("provenance.json")).read_text()
    assert TOKEN not in prov and TOKEN not in (case.manifests / "hubset.json").read_text()


def test_token_comes_from_the_huggingface_hub_token_file(case: HubCase) -> None:
    case.hub.repos[REPO].gated = True
    del case.env["HF_TOKEN"]
    token_file = case.tmp / "home" / ".cache" / "huggingface" / "token"
    token_file.parent.mkdir(parents=True)
    token_file.write_text(TOKEN + "\n")
    _sealed(case)
    case.env["HF_HOME"] = str(case.tmp / "hfhome")  # HF_HOME moves the file
    (case.tmp / "hfhome").mkdir()
    (case.tmp / "hfhome" / "token").write_text(TOKEN)
    token_file.unlink()
    assert [p.read_bytes() for p in case.provision().files] == [case.files[p] for p in PATHS]


def test_gated_repo_without_a_token_names_hf_token_exit_2(case: HubCase) -> None:
    case.hub.repos[REPO].gated = True
    del case.env["HF_TOKEN"]
    with pytest.raises(ConfigurationError) as caught:
        case.seal(include=["Q4/*.gguf"])
    line = caught.value.one_line()
    assert caught.value.exit_code == 2 and "\n" not in line
    assert "gated or private" in line and "set HF_TOKEN" in line and "check the URL" not in line
    assert [s.status for s in case.hub.seen] == [401]  # not retried


def test_gated_repo_provision_without_a_token_names_hf_token(case: HubCase) -> None:
    _sealed(case)
    case.hub.repos[REPO].gated = True
    del case.env["HF_TOKEN"]
    with pytest.raises(ConfigurationError, match="set HF_TOKEN"):
        case.provision()
    assert not case.storage.seen or all("/blobs/" in s.path for s in case.storage.seen)


def test_429_with_retry_after_is_honoured_once(case: HubCase) -> None:
    commit = _sealed(case)
    case.hub.seen.clear()
    case.hub.rate_limit = 1
    started = time.monotonic()
    done = case.provision()
    assert time.monotonic() - started >= 0.95
    statuses = [s.status for s in case.hub.seen]
    assert statuses[:2] == [429, 302] and statuses.count(429) == 1
    assert case.hub.seen[0].path == case.hub.seen[1].path == f"/{REPO}/resolve/{commit}/{PATHS[0]}"
    assert case.hub.seen[0].client_port == case.hub.seen[1].client_port  # the same connection, reused
    assert [p.read_bytes() for p in done.files] == [case.files[p] for p in PATHS]


def test_redirect_to_a_storage_host_the_origin_does_not_allow_is_refused(case: HubCase) -> None:
    _sealed(case)
    data = case.manifest()
    data["origins"][0]["allowed_redirect_hosts"] = ["127.0.0.1:1"]
    (case.manifests / "hubset.json").write_text(json.dumps(data))
    asked = len(case.storage.seen)
    with pytest.raises(IntegrityError, match="refused redirect .* to http://127.0.0.1"):
        case.provision()
    assert len(case.storage.seen) == asked  # nothing asked of it after the seal


def test_seal_refuses_bytes_other_than_the_hubs_sha256(case: HubCase) -> None:
    before = (case.manifests / "hubset.json").read_text()
    sha = hashlib.sha256(case.files[PATHS[1]]).hexdigest()
    case.storage.blobs[sha] = bytes(len(case.files[PATHS[1]]))  # storage serves other bytes
    with pytest.raises(IntegrityError, match=f"{PATHS[1]}: sha256 .* the hub states {sha}"):
        case.seal(include=["Q4/*.gguf"])
    assert (case.manifests / "hubset.json").read_text() == before


def test_seal_interrupted_resumes_at_the_last_whole_chunk(case: HubCase) -> None:
    first = case.files[PATHS[0]]
    case.storage.kill_after = 3 * CHUNK + 100
    with pytest.raises(RuntimeFailure, match=f"incomplete {3 * CHUNK} of {len(first)} bytes"):
        case.seal(include=["Q4/*.gguf"])
    case.storage.restart()
    case.storage.seen.clear()
    case.seal(include=["Q4/*.gguf"])
    assert case.storage.seen[0].headers.get("Range") == f"bytes={3 * CHUNK}-{len(first) - 1}"
    assert case.manifest()["variants"]["q4"]["files"][0]["sha256"] == hashlib.sha256(first).hexdigest()


def test_seal_checks_gguf_headers_against_the_manifest(case: HubCase) -> None:
    data = case.manifest()
    data["variants"]["q4"]["gguf"]["architecture"] = "gemma3"
    (case.manifests / "hubset.json").write_text(json.dumps(data))
    with pytest.raises(IntegrityError, match="gemma3"):
        case.seal(include=["Q4/*.gguf"])
    assert "revision" not in case.manifest()["origins"][0]


def test_seal_at_a_commit_needs_no_branch_and_include_filters(case: HubCase) -> None:
    commit = case.hub.repos[REPO].commit
    _path, got = case.seal(f"{REPO}@{commit}", include=["other/*.gguf"])
    assert got == commit
    assert [f["name"] for f in case.manifest()["variants"]["q4"]["files"]] == ["other/model-f16.gguf"]


def test_unknown_revision_is_a_configuration_error(case: HubCase) -> None:
    with pytest.raises(ConfigurationError, match="no such revision"):
        case.seal(f"{REPO}@nope", include=["Q4/*.gguf"])


def test_proxy_carries_both_hosts(case: HubCase, monkeypatch: pytest.MonkeyPatch) -> None:
    _sealed(case)
    with Proxy() as proxy:
        for name in ("http_proxy", "https_proxy", "all_proxy"):
            monkeypatch.delenv(name, raising=False)
            monkeypatch.delenv(name.upper(), raising=False)
        monkeypatch.setenv("NO_PROXY", "")
        monkeypatch.setenv("no_proxy", "")
        monkeypatch.setenv("HTTP_PROXY", f"http://{proxy.netloc}")
        monkeypatch.setenv("http_proxy", f"http://{proxy.netloc}")
        case.provision()
        via = {s.path.split("/")[2] for s in proxy.seen}
        assert via == {case.hub.netloc, case.storage.netloc}
        storage_side = [s for s in proxy.seen if s.path.split("/")[2] == case.storage.netloc]
        assert storage_side and all("Authorization" not in s.headers for s in storage_side)


def test_hub_origin_without_revision_refuses_sealed_variants(tmp_path: Path) -> None:
    from manifests.artifact_sets import parse_set

    data = {
        "schema_version": 1,
        "name": "x",
        "description": "",
        "storage": "any",
        "origins": [{"kind": "hub", "repo": REPO}],
        "default_variant": "v",
        "variants": {
            "v": {
                "chunk_size": CHUNK,
                "chunk_digest": "blake3",
                "gguf": {"architecture": "llama", "block_count": 1},
                "files": [
                    {
                        "name": "a.gguf",
                        "size": 1,
                        "sha256": "0" * 64,
                        "blake3": "0" * 64,
                        "chunks": ["0" * 64],
                    }
                ],
            }
        },
    }
    with pytest.raises(ConfigurationError, match="names no revision"):
        parse_set(data, source="x.json")
    data["origins"][0]["revision"] = "main"
    with pytest.raises(ConfigurationError):
        parse_set(data, source="x.json")  # a branch name is never recorded
    data["origins"][0]["revision"] = "a" * 40
    assert parse_set(data, source="x.json").origins[0].revision == "a" * 40


def test_endpoint_and_token_follow_the_huggingface_hub_conventions(tmp_path: Path) -> None:
    assert hub.endpoint(None, {}) == hub.DEFAULT_ENDPOINT
    assert hub.endpoint("https://mirror.example/", {}) == "https://mirror.example"
    assert (
        hub.endpoint("https://mirror.example", {"HF_ENDPOINT": "http://127.0.0.1:9/"}) == "http://127.0.0.1:9"
    )
    assert hub.token({"HF_TOKEN": " t1 ", "HOME": str(tmp_path)}) == "t1"
    assert hub.token({"HOME": str(tmp_path)}) is None
    (tmp_path / ".cache" / "huggingface").mkdir(parents=True)
    (tmp_path / ".cache" / "huggingface" / "token").write_text("t2\n")
    assert hub.token({"HOME": str(tmp_path)}) == "t2"
    (tmp_path / "p").write_text("t3")
    assert hub.token({"HOME": str(tmp_path), "HF_TOKEN_PATH": str(tmp_path / "p")}) == "t3"
    cred = hub.credential("https://hub.example", REPO, {"HF_TOKEN": "secret"})
    assert "secret" not in repr(cred)
    with pytest.raises(ConfigurationError):
        hub.parse_ref("not-a-repo")
    assert hub.parse_ref(REPO) == hub.HubRef(repo=REPO, revision="main")


class _Bars:
    """A progress factory that remembers each bar's label, total, initial and updates."""

    def __init__(self) -> None:
        self.bars: list[dict] = []

    def __call__(self, label: str, total: int, initial: int = 0) -> _Bars:
        self.bars.append({"label": label, "total": total, "initial": initial, "done": 0})
        return self

    def __enter__(self) -> _Bars:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self, n: int) -> None:
        self.bars[-1]["done"] += n


def test_progress_counts_resumed_bytes_as_done(case: HubCase) -> None:
    first = case.files[PATHS[0]]
    case.storage.kill_after = 3 * CHUNK + 100
    with pytest.raises(RuntimeFailure):
        case.seal(include=["Q4/*.gguf"])
    case.storage.restart()
    bars = _Bars()
    seal_hub(
        "hubset",
        f"{REPO}@main",
        ctx=case.ctx(),
        root=case.manifests,
        progress=bars,
        policy=FAST,
        include=["Q4/*.gguf"],
    )
    assert bars.bars[0] == {
        "label": f"seal {PATHS[0]}",
        "total": len(first),
        "initial": 3 * CHUNK,
        "done": len(first) - 3 * CHUNK,
    }
    case.storage.kill_after = case.storage.sent + 2 * CHUNK + 10
    with pytest.raises(RuntimeFailure):
        case.provision()
    case.storage.restart()
    bars = _Bars()
    case.provision(progress=bars)
    fetch = [b for b in bars.bars if b["label"] == f"fetch {PATHS[0]}"]
    assert fetch == [
        {
            "label": f"fetch {PATHS[0]}",
            "total": len(first),
            "initial": 2 * CHUNK,
            "done": len(first) - 2 * CHUNK,
        }
    ]


def test_cli_seal_from_the_hub(
    case: HubCase, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = run_cli(
        case,
        monkeypatch,
        "seal",
        "--artifacts",
        "hubset",
        "--from",
        f"hub:{REPO}@main",
        "--include",
        "Q4/*.gguf",
    )
    assert rc == 0
    assert f"({REPO} at {case.hub.repos[REPO].commit})" in capsys.readouterr().out
    assert case.manifest()["origins"][0]["revision"] == case.hub.repos[REPO].commit


def test_cli_gated_repo_without_a_token_is_one_line_exit_2(
    case: HubCase, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    case.hub.repos[REPO].gated = True
    del case.env["HF_TOKEN"]
    before = (case.manifests / "hubset.json").read_text()
    rc = run_cli(case, monkeypatch, "seal", "--artifacts", "hubset", "--from", f"hub:{REPO}@main")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert err[0].startswith("dgr: configuration error: ") and "set HF_TOKEN" in err[0]
    assert (case.manifests / "hubset.json").read_text() == before


def test_a_client_hanging_up_leaves_no_traceback_in_our_stderr(
    case: HubCase, capsys: pytest.CaptureFixture[str]
) -> None:
    # Under load a downloader giving up on a 401 closed its connection while the fake hub still read
    # or wrote it; socketserver printed "Exception occurred during processing of request" into this
    # process's stderr, and the one-line-error test above counted 3 lines instead of 1.
    import socket
    import struct

    for _ in range(3):
        with socket.create_connection(("127.0.0.1", case.hub.port)) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
            sock.sendall(b"GET /api/models HTTP/1.1\r\nHost: x\r\n")  # the request never ends
    err, deadline = "", time.monotonic() + 5  # before the fix the traceback came within milliseconds
    while "Exception occurred" not in err and time.monotonic() < deadline:
        time.sleep(0.05)
        err += capsys.readouterr().err
    assert "Exception occurred" not in err
