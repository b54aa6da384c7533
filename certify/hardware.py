"""Self-reported hardware fingerprint (what the machine says about itself; nothing here is attested)."""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from core import proc
from core.errors import DgrError


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_cores() -> int:
    """Cores this process may run on (a container's CPU set, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text(encoding="utf-8").splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.system()


def _nvidia_gpus(env: Mapping[str, str]) -> list[dict[str, Any]]:
    try:
        out = proc.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            env=env,
            no_output_timeout=20,
            check=False,
        )
    except DgrError:
        return []
    if out.returncode != 0:
        return []
    gpus = []
    for line in out.output.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3:
            gpus.append({"vendor": "nvidia", "name": parts[0], "memory": parts[1], "driver": parts[2]})
    return gpus


def fingerprint(env: Mapping[str, str]) -> dict[str, Any]:
    return {
        "self_reported": True,
        "cpu_model": _cpu_model(),
        "cpu_cores": cpu_cores(),
        "memory_bytes": _memory_bytes(),
        "os": _os_name(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "gpus": _nvidia_gpus(env),
    }


def gpu_names(fp: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(str(g.get("name", "")) for g in fp.get("gpus", []))
