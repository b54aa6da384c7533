"""RELIABILITY 1-9: downloads against a real loopback HTTP server that misbehaves on purpose.

Every case asserts the exact error, that the final path is absent (or correct), and for the resumable
cases how many bytes the server had to send again (at most one chunk).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from core.context import Context
from core.errors import IntegrityError, RuntimeFailure
from core.workspace import PROJECT_ROOT
from fetch.download import RetryPolicy
from fetch.provision import Provisioned, provision
from tests.unit.ggufmaker import split_set, write_set
from tests.unit.httpfault import FaultServer

CHUNK = 64 << 10
FAST = RetryPolicy(attempts=3, backoff_s=0.0, chunk_attempts=3, timeout_s=5.0)


@dataclass
class Served:
    server: FaultServer
    ctx: Context
    manifests: Path
    store: Path
    blob: bytes
    name: str

    @property
    def size(self) -> int:
        return len(self.blob)

    @property
    def final(self) -> Path:
        return self.store / "web" / "v" / self.name

    @property
    def part(self) -> Path:
        return self.final.with_name(f".{self.name}.part")

    @property
    def ledger(self) -> Path:
        return self.final.with_name(f".{self.name}.ledger")

    def run(self, policy: RetryPolicy = FAST, **kw: object) -> Provisioned:
        return provision(
            self.ctx, "web", store=self.store, manifests=self.manifests, policy=policy, progress=None, **kw
        )  # type: ignore[arg-type]

    def ledger_chunks(self) -> int:
        lines = self.ledger.read_text().splitlines()[1:]
        return len({line.split()[0] for line in lines if len(line.split()) == 2})

    def rewrite_manifest(self, **changes: object) -> None:
        path = self.manifests / "web.json"
        data = json.loads(path.read_text())
        data["variants"]["v"]["files"][0].update(changes)
        path.write_text(json.dumps(data))


@pytest.fixture
def served(tmp_path: Path, ctx: Context) -> Iterator[Served]:
    blob = split_set(1, [(5 * CHUNK + 1000) // 4 - 40])[0]
    with FaultServer() as server:
        origins = [{"kind": "http", "base_url": server.base_url}]
        entries = write_set(
            tmp_path / "src", tmp_path / "manifests", "web", [blob], chunk_size=CHUNK, origins=origins
        )
        server.files[entries[0]["name"]] = blob
        yield Served(
            server=server,
            ctx=ctx,
            manifests=tmp_path / "manifests",
            store=tmp_path / "store",
            blob=blob,
            name=entries[0]["name"],
        )


def give_up_after_two_chunks(served: Served) -> None:
    served.server.faults.close_plan = [2 * CHUNK + 5, 0]
    with pytest.raises(RuntimeFailure, match="incomplete"):
        served.run(RetryPolicy(attempts=1, backoff_s=0.0, timeout_s=5.0))
    served.server.faults.close_plan = []


def test_clean_download_publishes_verified_file(served: Served) -> None:
    done = served.run()
    assert done.files == (served.final,) and done.first == served.final
    assert served.final.read_bytes() == served.blob
    assert done.bytes_fetched == served.size
    assert not served.part.exists() and not served.ledger.exists()
    assert done.provenance["files"][0]["size"] == served.size
    assert json.loads(done.provenance_path.read_text())["manifest_digest"] == done.manifest_digest


def test_case1_wrong_whole_file_digest_never_published(served: Served) -> None:
    served.rewrite_manifest(blake3="ab" * 32)
    with pytest.raises(
        IntegrityError, match=f"whole-file blake3 mismatch: expected {'ab' * 32}, got [0-9a-f]{{64}}"
    ):
        served.run()
    assert not served.final.exists() and not served.part.exists()


def test_case1_origin_serving_other_bytes_never_published(served: Served) -> None:
    served.server.files[served.name] = bytes(served.size)
    with pytest.raises(IntegrityError, match="chunk 0 at offset 0 .* failed verification 3 times"):
        served.run()
    assert not served.final.exists()


def test_case2_closed_early_reports_incomplete_and_resumes_from_last_verified_chunk(served: Served) -> None:
    served.server.faults.close_plan = [2 * CHUNK + CHUNK // 2, 0, 0]
    with pytest.raises(RuntimeFailure, match=f"incomplete {2 * CHUNK} of {served.size} bytes after 2 failed"):
        served.run(RetryPolicy(attempts=2, backoff_s=0.0, timeout_s=5.0))
    assert not served.final.exists()
    assert served.ledger_chunks() == 2
    first_run = served.server.bytes_sent()
    served.server.reset_log()
    done = served.run()
    assert served.final.read_bytes() == served.blob
    assert served.server.log[0].range == f"bytes={2 * CHUNK}-{served.size - 1}"
    assert served.server.bytes_sent() == served.size - 2 * CHUNK == done.bytes_fetched
    assert first_run + served.server.bytes_sent() - served.size <= CHUNK  # at most one chunk fetched again


def test_case2_closed_early_is_retried_within_a_run(served: Served) -> None:
    served.server.faults.close_after = 3 * CHUNK + 10
    done = served.run()
    assert served.final.read_bytes() == served.blob
    assert done.bytes_fetched - served.size <= CHUNK


def test_case3_longer_body_stops_at_expected_length(served: Served) -> None:
    served.server.faults.ignore_range = True
    served.server.faults.extra = b"trailing garbage"
    with pytest.raises(IntegrityError, match="unexpected size: the origin sends more than"):
        served.run()
    assert not served.final.exists()


def test_case3_longer_body_without_length_stops_at_expected_length(served: Served) -> None:
    served.server.faults.ignore_range = True
    served.server.faults.extra = b"x" * 5000
    served.server.faults.extra_no_length = True
    with pytest.raises(IntegrityError, match="unexpected size"):
        served.run()
    assert not served.final.exists()


def test_case3_longer_file_behind_206_rejected(served: Served) -> None:
    served.server.files[served.name] = served.blob + b"more"
    with pytest.raises(
        IntegrityError, match=f"unexpected size: Content-Range .* reports {served.size + 4} bytes"
    ):
        served.run()
    assert not served.final.exists()


def test_case4_200_to_a_range_request_restarts_from_zero(served: Served) -> None:
    give_up_after_two_chunks(served)
    served.server.reset_log()
    served.server.faults.ignore_range = True
    done = served.run()
    assert served.final.read_bytes() == served.blob
    first = served.server.log[0]
    assert first.range == f"bytes={2 * CHUNK}-{served.size - 1}" and first.status == 200
    assert done.bytes_fetched == served.size  # the whole body, consumed from byte 0


@pytest.mark.parametrize(
    "content_range,message",
    [
        ("bytes 100-200/{size}", "rejected 206 response: Content-Range 'bytes 100-200/.*' does not match"),
        ("bytes 0-99/999999999", "unexpected size: Content-Range"),
        ("bytes */{size}", "rejected 206 response with Content-Range"),
    ],
)
def test_case5_206_with_wrong_content_range_rejected(
    served: Served, content_range: str, message: str
) -> None:
    served.server.faults.content_range = content_range.format(size=served.size)
    with pytest.raises(IntegrityError, match=message):
        served.run()
    assert not served.final.exists()


def test_case6_etag_change_same_bytes_restarts_and_succeeds(served: Served) -> None:
    give_up_after_two_chunks(served)
    served.server.etags[served.name] = '"v2"'
    served.server.reset_log()
    served.run()
    assert served.server.log[0].if_range == f'"v1-{served.name}"' and served.server.log[0].status == 200
    assert served.final.read_bytes() == served.blob


def test_case6_changed_content_discarded_manifest_decides(served: Served) -> None:
    give_up_after_two_chunks(served)
    served.server.etags[served.name] = '"v2"'
    served.server.files[served.name] = served.blob[: 3 * CHUNK] + bytes(served.size - 3 * CHUNK)
    with pytest.raises(IntegrityError, match=f"chunk 3 at offset {3 * CHUNK}"):
        served.run()
    assert not served.final.exists()
    assert served.ledger_chunks() == 3  # verified chunks stay; the changed ones never landed


def test_case7_flipped_bit_refetches_only_that_chunk(served: Served) -> None:
    served.server.faults.flip_offset = 3 * CHUNK + 10
    done = served.run()
    assert served.final.read_bytes() == served.blob
    assert done.bytes_fetched == served.size + CHUNK
    assert served.server.log[-1].range == f"bytes={3 * CHUNK}-{4 * CHUNK - 1}"


def test_case7_persistent_flip_is_an_error_with_the_offset(served: Served) -> None:
    served.server.faults.flip_offset = 3 * CHUNK + 10
    served.server.faults.flip_times = 99
    with pytest.raises(IntegrityError, match=f"chunk 3 at offset {3 * CHUNK} .* failed verification 3 times"):
        served.run()
    assert not served.final.exists()
    assert served.ledger_chunks() == 5  # every chunk but the flipped one


def test_case8_redirect_to_other_host_refused_unless_allowed(served: Served) -> None:
    port = served.server.port
    served.server.faults.redirect[f"/files/{served.name}"] = f"http://localhost:{port}/other/{served.name}"
    with pytest.raises(IntegrityError, match="refused redirect .* to http://localhost"):
        served.run()
    assert not served.final.exists()
    data = json.loads((served.manifests / "web.json").read_text())
    data["origins"][0]["allowed_redirect_hosts"] = ["localhost"]
    (served.manifests / "web.json").write_text(json.dumps(data))
    served.server.faults.redirect[f"/other/{served.name}"] = f"/files/x/{served.name}"
    served.server.files[served.name] = served.blob
    served.run()
    assert served.final.read_bytes() == served.blob


def test_case8_redirect_to_other_scheme_refused(served: Served) -> None:
    served.server.faults.redirect[f"/files/{served.name}"] = f"https://127.0.0.1:{served.server.port}/f"
    with pytest.raises(IntegrityError, match="another scheme"):
        served.run()


def test_case8_too_many_hops_refused(served: Served) -> None:
    served.server.faults.redirect[f"/files/{served.name}"] = "/loop/a"
    served.server.faults.redirect["/loop/a"] = "/loop/b"
    served.server.faults.redirect["/loop/b"] = "/loop/a"
    with pytest.raises(IntegrityError, match="more than 5 redirects"):
        served.run()
    assert len(served.server.log) == 6


def test_4xx_is_never_retried(served: Served) -> None:
    served.server.faults.status, served.server.faults.status_times = 404, 5
    with pytest.raises(RuntimeFailure, match="HTTP 404 .*not retried"):
        served.run()
    assert len(served.server.log) == 1


def test_5xx_is_retried_with_backoff(served: Served) -> None:
    served.server.faults.status, served.server.faults.status_times = 503, 2
    served.run()
    assert [s.status for s in served.server.log] == [503, 503, 206]
    assert served.final.read_bytes() == served.blob


def test_stalled_origin_times_out_and_gives_up_keeping_verified_chunks(served: Served) -> None:
    served.server.faults.stall_s = 1.0  # headers, then silence longer than the read timeout
    with pytest.raises(
        RuntimeFailure, match=r"incomplete \d+ of \d+ bytes after 2 failed attempts .*timed out"
    ):
        served.run(RetryPolicy(attempts=2, backoff_s=0.0, timeout_s=0.5))
    assert not served.final.exists()
    served.server.faults.stall_s = 0.0


CHILD = """
import sys
from pathlib import Path
from core.context import Context
from fetch.download import RetryPolicy
from fetch.provision import provision
provision(Context.from_env(), "web", store=sys.argv[1], manifests=Path(sys.argv[2]),
          policy=RetryPolicy(backoff_s=0.0, timeout_s=5.0))
"""


def test_case9_kill_minus_9_mid_chunk_resumes_and_final_name_never_exists(served: Served) -> None:
    # Three chunks, then the origin goes quiet mid-file: the child is killed while it waits for more.
    served.server.faults.pause_after, served.server.faults.pause_s = 3 * CHUNK, 30.0
    env = {**served.ctx.env, "PYTHONPATH": str(PROJECT_ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(served.store), str(served.manifests)],
        cwd=PROJECT_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert not served.final.exists()
            if served.ledger.exists() and served.ledger_chunks() >= 3:
                break
            time.sleep(0.01)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait()
    assert child.returncode == -signal.SIGKILL
    assert not served.final.exists() and served.part.exists()
    verified = served.ledger_chunks()
    assert verified == 3
    served.server.faults.pause_after = None
    served.server.faults.resume.set()
    served.server.reset_log()
    done = served.run()
    assert served.final.read_bytes() == served.blob
    assert done.bytes_fetched == served.size - verified * CHUNK


def test_unreachable_origin_falls_through_to_the_next(served: Served) -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]  # closed again: nothing listens there
    data = json.loads((served.manifests / "web.json").read_text())
    data["origins"].insert(0, {"kind": "http", "base_url": f"http://127.0.0.1:{dead}/files"})
    (served.manifests / "web.json").write_text(json.dumps(data))
    done = served.run(RetryPolicy(attempts=2, backoff_s=0.0, timeout_s=5.0))
    assert served.final.read_bytes() == served.blob and done.bytes_fetched == served.size
