"""A description of the machine a benchmark ran on (recorded with every result)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

from dflash_core.tuning.auto_dtype import cpu_kernels

# environment variables that make torch run lesser kernels than the CPU has (an AVX2-only CPU, emulated)
KERNEL_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")


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
                return sorted(f for f in flags if f.startswith(("avx512", "amx")) or f in ("avx2", "fma", "avx_vnni"))
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
        "torch_kernels": cpu_kernels(),
    }
    caps = {name: os.environ[name] for name in KERNEL_CAPS if os.environ.get(name)}
    if caps:
        info["kernel_caps"] = caps
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def isa_summary(flags: list[str]) -> str:
    """The vector ISA levels that decide bf16 vs fp32 speed: "AVX2, no AVX-512, no AMX" and alike."""
    parts = ["AVX2" if "avx2" in flags else "no AVX2"]
    if "avx512f" in flags:
        parts.append("AVX-512 with BF16" if "avx512_bf16" in flags else "AVX-512 without BF16")
    else:
        parts.append("no AVX-512")
    parts.append("AMX-BF16" if "amx_bf16" in flags else "no AMX")
    return ", ".join(parts)


def one_line(info: dict) -> str:
    flags = info.get("cpu_flags", [])
    gpu = f", {info['gpu']}" if "gpu" in info else ", no GPU"
    caps = info.get("kernel_caps")
    capped = (f"; torch's kernels capped by {' '.join(f'{k}={v}' for k, v in caps.items())} to {info['torch_kernels']}"
              if caps else "")
    return (f"{info['cpu']} ({info['cores']} cores, {isa_summary(flags)}{gpu}; flags {' '.join(flags) or 'unknown'}"
            f"{capped}), torch {info['torch']} with {info['torch_threads']} threads")
