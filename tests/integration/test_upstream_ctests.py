"""Issue 18 item 2: the upstream-style tests the generic patches add, built and run the way upstream
runs them (a targeted build of the patched tree with tests on, then ctest), on the CPU.

0001 adds tests/test-layer-range.cpp, 0002 tests/test-stage-boundary.cpp, 0003
tests/test-layer-filtered-kv.cpp, each registered in tests/CMakeLists.txt with label ``main`` and
run on the llama model upstream's ``test-generate-models`` fixture writes (test-llama-archs -o);
0005 adds tests/test-host-huge-pages.cpp (no model: a large CPU buffer is advised for huge pages,
skipped with exit 77 where the kernel has no transparent huge pages).
The build is lanes.upstream_build's (the CPU lane's switches with tests on, ccache through the
workspace), so on a machine that built the CPU lane only the five test executables compile.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from lanes.upstream_build import ensure_test_build
from patches.stack import ensure_patched

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

STAGE_TESTS = ("test-layer-range", "test-stage-boundary", "test-layer-filtered-kv")
PATCH_TESTS = (*STAGE_TESTS, "test-host-huge-pages")
THP = Path("/sys/kernel/mm/transparent_hugepage")


def test_the_patches_own_tests_pass_under_ctest(real_ctx, cpu_build) -> None:
    patched = ensure_patched(real_ctx)
    t0 = time.monotonic()
    build = ensure_test_build(
        real_ctx,
        side="patched",
        tree=patched.path,
        tree_digest=patched.digest,
        commit=patched.pristine.commit,
        targets=("test-llama-archs", *PATCH_TESTS),
        root=real_ctx.workspace.ensure(real_ctx.workspace.upstream),
    )
    assert not build.error, build.error
    built = time.monotonic() - t0
    t1 = time.monotonic()
    wanted = "^(" + "|".join(PATCH_TESTS) + ")$"
    done = subprocess.run(
        [
            "ctest",
            "--test-dir",
            str(build.dir / "llama" / "tests"),
            "-R",
            wanted,
            "--output-on-failure",
            "--timeout",
            "300",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    ran = time.monotonic() - t1
    print(f"\n[ctest] build {built:.1f} s (configure {build.configure_s} s), ctest {ran:.1f} s")
    print(done.stdout[-3000:])
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    for name in ("test-generate-models", *STAGE_TESTS):  # the fixture ran first, then each test
        assert re.search(rf"Test +#\d+: {name} \.+ +Passed", done.stdout), name
    huge_pages = "Passed" if THP.is_dir() else r"\*+Skipped"  # a kernel without THP has nothing to advise
    assert re.search(rf"Test +#\d+: test-host-huge-pages \.+ *{huge_pages}", done.stdout), done.stdout[-2000:]
