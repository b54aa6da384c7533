"""The device bundle made for real, then the device script's CPU-side steps run from it (a dry run).

The bundle is built into tmp from this checkout's HEAD with wheels for this interpreter's CPython
only, tiny-llama's files carried, tiny-v4 left to be regenerated and tqdm left out (the venv then finds it in
the interpreter it was made from).  Then ``scripts/device-cuda.sh
--dry-run --lane cpu`` runs from the bundle alone, forced onto the bundled wheels (a venv installed
offline) and the carried Debian 12 sysroot: bundle check, Python, sysroot, fetch --reverify of the
carried tree, patch, provision.  Wheels and .deb files are cached (``$DGR_CACHE``) after the first run,
so only that one needs the package index.  About 1.5 minutes warm on the 2-core box.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.context import Context
from core.workspace import PROJECT_ROOT
from device import bundle, manifest, sysroot, wheels
from fetch.source import load_pin

pytestmark = pytest.mark.slow

# What the wheels must hold for the device: every compiled dependency and the resolver's pure ones.
COMPILED = {
    "grpcio",
    "grpcio-tools",
    "protobuf",
    "cryptography",
    "cffi",
    "blake3",
    "numpy",
    "pandas",
    "rpds-py",
    "pyyaml",
    "markupsafe",
}
PURE = {"jsonschema", "jsonschema-specifications", "referencing", "attrs", "jinja2", "pip"}
STEPS = ["probe", "bundle-check", "python", "sysroot", "fetch", "patch", "provision"]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> bundle.Bundle:
    ctx = Context.from_env()
    options = bundle.Options(
        out=tmp_path_factory.mktemp("device") / "bundle",
        pythons=(f"{sys.version_info.major}.{sys.version_info.minor}",),
        recipes=("tiny-llama", "tiny-v4"),
        carry_generated=("tiny-llama",),
        omit_wheels=("tqdm",),  # then it comes from the interpreter the venv is made from
        allow_dirty=True,  # the bundle is HEAD either way; the dirty paths are recorded
    )
    return bundle.build(ctx, options, log=lambda line: print(line, flush=True))


def test_bundle_contents(made: bundle.Bundle) -> None:
    root, doc = made.path, made.manifest
    files = doc["files"]
    head = subprocess.run(
        ["git", "-C", str(PROJECT_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert doc["project"]["commit"] == head
    assert files["project/scripts/device-cuda.sh"]["executable"] is True
    assert "project/pyproject.toml" in files and "project/device/bundle.py" in files
    assert not any("/__pycache__/" in f for f in files)

    pin = load_pin()
    assert doc["llama"]["tree"] == pin.tree and doc["llama"]["commit"] == pin.commit
    assert f"{doc['llama']['dir']}/CMakeLists.txt" in files and doc["llama"]["provenance"] in files

    tag = wheels.tag(f"{sys.version_info.major}.{sys.version_info.minor}")
    carried = doc["wheels"]["sets"][tag]["wheels"]
    assert COMPILED | PURE <= {w["name"] for w in carried} and "tqdm" not in {w["name"] for w in carried}
    for w in carried:
        python_tag, abi_tag, platform_tag = w["file"][: -len(".whl")].split("-")[-3:]
        assert python_tag in (tag, "py3", "py2.py3") or abi_tag == "abi3", w["file"]
        assert platform_tag == "any" or "manylinux" in platform_tag, w["file"]
        assert f"wheels/{tag}/{w['file']}" in files
    assert (root / "wheels" / "requirements.txt").read_text().splitlines() == doc["wheels"]["requirements"]

    assert {"grpc.pc", "grpc++.pc", "gpr.pc"} <= set(doc["sysroot"]["pc_libdir_fixed"])
    pc = root / "sysroot" / "usr" / "lib" / sysroot.MULTIARCH / "pkgconfig" / "grpc++.pc"
    assert f"libdir=${{exec_prefix}}/lib/{sysroot.MULTIARCH}\n" in pc.read_text()
    assert not any(f.startswith("sysroot/") and f.endswith(".a") for f in files)
    found = sysroot.check(root / "sysroot", dict(os.environ))
    assert found.versions == {"grpc++": "1.51.1", "protobuf": "3.21.12"}

    sets = {a["set"]: a for a in doc["artifacts"]}
    assert sets["tiny-v4"]["carried"] is False
    assert sets["tiny-llama"]["carried"] is True and len(sets["tiny-llama"]["files"]) == 3
    assert all(f"store/tiny-llama/f32/{name}" in files for name in sets["tiny-llama"]["files"])
    assert manifest.problems(root) == []


def test_dry_run_from_the_bundle(made: bundle.Bundle, tmp_path: Path) -> None:
    dropped = ("DGR_", "OUT", "PYTHONPATH", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    env.update(
        DGR_DEVICE_VENV="always",
        DGR_DEVICE_SYSROOT="always",
        HOME=str(tmp_path / "home"),
        PYTHON=sys.executable,
    )  # a venv's python, as on the GPU box (whose python3 is a venv's)
    out, work = tmp_path / "out", tmp_path / "work"
    script = made.path / "project" / "scripts" / "device-cuda.sh"
    done = subprocess.run(
        ["bash", str(script), "--dry-run", "--lane", "cpu", "--out", str(out), "--work", str(work)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = (out / "log.txt").read_text()
    assert done.returncode == 0, log[-4000:]

    summary = json.loads((out / "summary.json").read_text())
    assert summary["dry_run"] is True and summary["lane"] == "cpu"
    assert [s["step"] for s in summary["steps"]] == STEPS
    assert all(s["exit"] == 0 for s in summary["steps"])
    assert summary["python"] == str(work / "venv" / "bin" / "python")  # the bundled wheels, installed offline
    print(
        "\n[device dry run] "
        + ", ".join(f"{s['step']} {s['seconds']} s" for s in summary["steps"])
        + f"; total {summary['seconds']} s"
    )

    assert "has everything the project needs" in log
    assert "omitted wheels (tqdm) come from" in log
    assert "pkg-config 1.8.1: grpc++ 1.51.1 protobuf 3.21.12" in log
    assert f"-L{made.path}/sysroot/usr/lib/{sysroot.MULTIARCH}" in log
    assert "protoc + grpc_cpp_plugin generated: shard.grpc.pb.cc" in log
    assert f"tree {load_pin().tree} (source:" in log  # dgr fetch --reverify of the carried tree
    assert "provisioned tiny-llama/f32 (3 files" in log and "provisioned tiny-v4/f32 (3 files" in log
    assert "dgr certify --recipe tiny-v4 --lane cpu" in log  # printed, not run

    listing = subprocess.run(
        ["tar", "-tzf", str(out / "results.tar.gz")], capture_output=True, text=True, check=True
    ).stdout.split()
    assert {
        "results/log.txt",
        "results/summary.json",
        "results/timings.tsv",
        "results/provenance/BUNDLE.json",
        "results/provenance/store-tiny-v4-f32.json",
    } <= set(listing)
    assert manifest.problems(made.path) == []  # the run wrote nothing into the bundle
