"""What a lane needs when its workers run, and proof afterwards that they ran on the lane's device.

A worker built for a GPU lane silently falls back to the CPU when it finds no device (ggml's Vulkan
backend, for one, skips CPU-type devices such as Mesa's lavapipe unless told to use them).  A run
whose lane workers report no device of their backend is therefore not a certification of that lane:
``lane_device`` refuses it before anything is signed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from core.errors import RuntimeFailure

# The ggml device name prefix each lane's backend reports (ggml_backend_dev_name: "Vulkan0", "CUDA0").
DEVICE_PREFIX: dict[str, str] = {"cuda": "CUDA", "rocm": "ROCm", "vulkan": "Vulkan", "metal": "MTL"}

# Device descriptions that name a software implementation, not a GPU.
SOFTWARE_RASTERIZERS: dict[str, str] = {
    "llvmpipe": "Mesa lavapipe (llvmpipe)",
    "lavapipe": "Mesa lavapipe",
    "swiftshader": "SwiftShader",
}


def worker_environment(lane: str, env: Mapping[str, str]) -> dict[str, str]:
    """Variables the lane's workers need on top of ``env`` (e.g. which Vulkan device to use)."""
    from lanes.base import get

    hook = getattr(get(lane), "worker_environment", None)
    return dict(hook(env)) if hook is not None else {}


def lane_device(lane: str, placements: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The device the lane's workers used, with ``software_rasterizer`` set for lavapipe and kin.

    None for the CPU lane.  RuntimeFailure when a lane worker reports no device of its backend.
    """
    prefix = DEVICE_PREFIX.get(lane)
    if prefix is None:
        return None
    reported = sorted({d for p in placements if p.get("lane") == lane for d in p.get("backend_devices", [])})
    if not reported:
        raise RuntimeFailure(f"no {lane} worker reported its backend devices; nothing was signed")
    devices = sorted({part for d in reported for part in _split(d) if part.startswith(prefix)})
    missing = [d for d in reported if prefix not in d]
    if missing or not devices:
        raise RuntimeFailure(
            f"the {lane} workers ran without a {prefix} device (backend devices: {'; '.join(reported)}); "
            "a CPU fallback is not a certification of this lane",
            hint=_device_hint(lane),
        )
    soft = [name for key, name in SOFTWARE_RASTERIZERS.items() if any(key in d.lower() for d in devices)]
    out: dict[str, Any] = {"lane": lane, "devices": devices, "software_rasterizer": bool(soft)}
    if soft:
        out["note"] = f"software rasterizer ({', '.join(dict.fromkeys(soft))}): runs on the CPU, not a GPU"
    return out


def _split(listing: str) -> list[str]:
    """ "Vulkan0 (llvmpipe (LLVM 15, 256 bits)), CPU" -> its devices (commas inside parentheses stay)."""
    parts, depth, current = [], 0, ""
    for ch in listing:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    return [p for p in [*parts, current.strip()] if p]


def _device_hint(lane: str) -> str:
    if lane == "vulkan":
        return (
            "install a Vulkan driver (mesa-vulkan-drivers for lavapipe) and point VK_ICD_FILENAMES at it; "
            "a CPU-type device needs GGML_VK_VISIBLE_DEVICES (set for you when every ICD is lavapipe)"
        )
    return f"run on a machine with a {lane} device"
