"""A description of the machine a benchmark ran on (recorded with every result)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def cpu_flags() -> list[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                return sorted(f for f in flags if f.startswith(("avx512", "amx")) or f in ("avx2", "fma"))
    except OSError:
        pass
    return []


def describe() -> dict:
    info = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cpu_flags": cpu_flags(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def one_line(info: dict) -> str:
    flags = info.get("cpu_flags", [])
    amx = "AMX-BF16" if "amx_bf16" in flags else ("AVX-512 BF16, no AMX" if "avx512_bf16" in flags else "no AMX")
    gpu = f", {info['gpu']}" if "gpu" in info else ", no GPU"
    return f"{info['cpu']} ({info['cores']} cores, {amx}{gpu}), torch {info['torch']} with {info['torch_threads']} threads"
