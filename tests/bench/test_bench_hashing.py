"""``dgr verify``'s file hashing before and after the one hasher, in one run on one ~512 MiB file.

- before: the old ``certify.certificate.file_digests`` (kept here only, as the reference): 1 MiB
  ``read`` calls, each fed to sha256 and then to a single-threaded blake3;
- after: ``certify.certificate.file_digests`` as it is now (core.hashing: mmap, multi-threaded blake3,
  sha256 on a helper thread beside it).

Both give the same digests (checked).  The old path runs in pedantic's untimed ``setup`` right before
each of our rounds (interleaved, like tests/bench/test_bench_provision.py), so background load on a
shared box hits both alike; the best round of each is compared.  The file is read once before the
rounds, so both sides hash from the page cache.  The figures and the load average go into
``extra_info`` and are printed, with CPU time per wall second (how many cores each side kept busy).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import blake3
import pytest

from certify.certificate import file_digests

SIZE = 512 << 20
ROUNDS = 5
OLD_BLOCK = 1 << 20  # the old HASH_BLOCK


def _old_file_digests(path: Path) -> dict[str, str]:
    """The single-threaded hasher ``dgr verify`` used before core.hashing (reference only)."""
    sha = hashlib.sha256()
    b3 = blake3.blake3()
    with open(path, "rb") as fh:
        while block := fh.read(OLD_BLOCK):
            sha.update(block)
            b3.update(block)
    return {"sha256": sha.hexdigest(), "blake3": b3.hexdigest()}


@pytest.fixture(scope="module")
def big_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hashing") / "big.bin"
    with open(path, "wb") as fh:
        left = SIZE
        while left:
            n = min(left, 64 << 20)
            fh.write(os.urandom(n))
            left -= n
    return path


def _timed(
    fn: Callable[[], object], into: list[tuple[float, float]], out: list[object]
) -> Callable[[], None]:
    """``fn`` recording (wall s, CPU s of this process) per call: CPU / wall above 1 means it ran on
    more than one core at once."""

    def run() -> None:  # returns None: pedantic reads a setup's return value as (args, kwargs)
        t0, c0 = time.perf_counter(), time.process_time()
        out.append(fn())
        into.append((time.perf_counter() - t0, time.process_time() - c0))

    return run


def test_bench_verify_hashing_before_after(benchmark, big_file: Path) -> None:
    expected = _old_file_digests(big_file)  # also warms the page cache
    old_times: list[tuple[float, float]] = []
    new_times: list[tuple[float, float]] = []
    old_results: list[object] = []
    new_results: list[object] = []
    benchmark.pedantic(
        _timed(lambda: file_digests(big_file), new_times, new_results),
        setup=_timed(lambda: _old_file_digests(big_file), old_times, old_results),
        rounds=ROUNDS,
    )
    assert all(r == expected for r in old_results + new_results) and len(new_results) == ROUNDS
    old_s, old_cpu = min(old_times)
    new_s, new_cpu = min(new_times)
    load1, load5, _ = os.getloadavg()
    figures = {
        "old_mib_s": SIZE / old_s / 2**20,
        "new_mib_s": SIZE / new_s / 2**20,
        "old_best_s": old_s,
        "new_best_s": new_s,
        "ratio_new_vs_old": old_s / new_s,
        "old_cpu_per_wall": old_cpu / old_s,
        "new_cpu_per_wall": new_cpu / new_s,
        "loadavg_1m": load1,
        "loadavg_5m": load5,
        "cpus": float(os.cpu_count() or 0),
    }
    benchmark.extra_info.update(figures)
    print("\n[bench] verify hashing, 512 MiB: " + ", ".join(f"{k}={v:.3f}" for k, v in figures.items()))
