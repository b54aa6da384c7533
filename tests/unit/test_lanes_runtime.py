"""Lane runtime: the worker environment for lavapipe and the check that lane workers used their device."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import RuntimeFailure
from lanes import runtime, vulkan
from reports.render import render

LVP = "Vulkan0 (llvmpipe (LLVM 15.0.6, 256 bits)), CPU"


def placement(lane: str, *devices: str) -> dict[str, object]:
    return {"name": "p", "lane": lane, "backend_devices": list(devices)}


def test_cpu_lane_has_no_device_to_prove() -> None:
    assert runtime.lane_device("cpu", [placement("cpu", "CPU")]) is None


def test_lavapipe_is_marked_as_a_software_rasterizer() -> None:
    got = runtime.lane_device("vulkan", [placement("cpu", "CPU"), placement("vulkan", LVP)])
    assert got == {
        "lane": "vulkan",
        "devices": ["Vulkan0 (llvmpipe (LLVM 15.0.6, 256 bits))"],
        "software_rasterizer": True,
        "note": "software rasterizer (Mesa lavapipe (llvmpipe)): runs on the CPU, not a GPU",
    }


def test_a_real_gpu_is_not_marked_software() -> None:
    got = runtime.lane_device("cuda", [placement("cuda", "CUDA0 (NVIDIA H200), CPU")])
    assert got is not None and got["software_rasterizer"] is False and "note" not in got


def test_a_cpu_fallback_is_refused() -> None:
    """ggml's Vulkan backend skips lavapipe unless told: the worker then runs on CPU only."""
    with pytest.raises(RuntimeFailure, match="ran without a Vulkan device .*CPU fallback") as err:
        runtime.lane_device("vulkan", [placement("vulkan", LVP), placement("vulkan", "CPU")])
    assert "GGML_VK_VISIBLE_DEVICES" in err.value.one_line()
    with pytest.raises(RuntimeFailure, match="reported its backend devices"):
        runtime.lane_device("vulkan", [placement("cpu", "CPU")])


def test_lavapipe_only_names_device_zero(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lvp = tmp_path / "lvp_icd.x86_64.json"
    lvp.write_text("{}")
    radeon = tmp_path / "radeon_icd.x86_64.json"
    radeon.write_text("{}")
    assert runtime.worker_environment("vulkan", {"VK_ICD_FILENAMES": str(lvp)}) == {
        "GGML_VK_VISIBLE_DEVICES": "0"
    }
    assert runtime.worker_environment("vulkan", {"VK_DRIVER_FILES": f"{lvp}:{radeon}"}) == {}
    chosen = {"VK_ICD_FILENAMES": str(lvp), "GGML_VK_VISIBLE_DEVICES": "1"}
    assert runtime.worker_environment("vulkan", chosen) == {}  # the user's choice stands
    assert runtime.worker_environment("cpu", {"VK_ICD_FILENAMES": str(lvp)}) == {}
    monkeypatch.setattr(vulkan, "ICD_DIRS", (str(tmp_path),))
    assert vulkan.icd_files({}) == [lvp, radeon]


def test_matrix_names_the_runner_labels_each_lane_needs(tmp_path: Path) -> None:
    from core.context import Context
    from lanes.base import all_lanes
    from reports.matrix import matrix

    ctx = Context.from_env({"DGR_WORK": str(tmp_path / "work"), "DGR_CACHE": str(tmp_path / "cache")})
    rows = {e["lane"]: e for e in matrix(ctx)["include"]}
    assert list(rows) == ["cpu", "cuda", "rocm", "vulkan", "metal"]
    for lane in all_lanes():
        assert rows[lane.name]["runner-labels"] == list(lane.runner_labels)
        assert rows[lane.name]["status"] in ("certified", "compile-only")
    # A GPU lane's job runs on a hosted box (compile-only) but still says which runner certifies it.
    assert rows["cuda"]["runs-on"] == ["ubuntu-latest"] and "gpu-nvidia" in rows["cuda"]["runner-labels"]
    assert all(e["status"] == "compile-only" for e in rows.values())  # an empty workspace certifies nothing


def test_a_gpu_lane_certificate_names_its_device(tmp_path: Path) -> None:
    """Fake workers of the vulkan lane: the device they report reaches the certificate and the page."""
    import dataclasses

    from certify import keys
    from certify.run import run_certification
    from certify.verify import verify
    from tests.unit.certify_fixtures import (
        FLOORS_NO_LOAD_CAN_MISS,
        fake_context,
        fake_prepared,
        recipe_from,
        small_recipe_doc,
    )

    doc = small_recipe_doc()
    doc["hardware_classes"][2]["speed"] = dict(FLOORS_NO_LOAD_CAN_MISS)
    prepared = fake_prepared(tmp_path)
    prepared = dataclasses.replace(prepared, reference_worker=prepared.worker)
    ctx = fake_context(tmp_path)
    w = run_certification(ctx, recipe_from(tmp_path, doc), "vulkan", prepared, render=render)
    pred = verify(w.certificate, keys.trusted_keys(ws=ctx.workspace)).predicate
    assert pred["hardware"]["lane_device"] == {
        "lane": "vulkan",
        "devices": ["Vulkan0 (fake numpy device)"],
        "software_rasterizer": False,
    }
    html = w.html.read_text()
    assert 'id="device"' in html and "Vulkan0 (fake numpy device)" in html
    assert "software rasterizer" not in html
