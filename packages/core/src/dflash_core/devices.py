"""The machine: checking a torch device name before anything is loaded onto it (one sentence instead of torch's
assertion), what the CPU is, and waiting for a device's queued work."""

from __future__ import annotations

import functools
import platform
from pathlib import Path

import torch

from dflash_core.errors import DFlashError


def check_device(device: str | torch.device) -> torch.device:
    """`device` as a torch.device, refused with one line when it is malformed or absent on this machine."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise DFlashError(f"device {str(device)!r} is not a torch device, expected cpu, cuda, cuda:N or mps.") from None
    if dev.type == "cpu":
        return dev
    if dev.type == "meta":
        raise DFlashError("device 'meta' holds no data, expected a device that computes (cpu, cuda, cuda:N, mps).")
    if dev.type == "cuda":
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            raise DFlashError(f"device {str(device)!r} needs CUDA, but this torch {torch.__version__} is built "
                              "without it; use --device cpu or install a CUDA build of torch.")
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise DFlashError(f"device {str(device)!r}: no CUDA device is visible on this machine; use --device cpu.")
        if dev.index is not None and dev.index >= count:
            raise DFlashError(f"device {str(device)!r}: this machine has {count} CUDA device(s), "
                              f"expected an index in [0, {count}).")
        return dev
    backend = getattr(torch.backends, dev.type, None) or getattr(torch, dev.type, None)
    available = getattr(backend, "is_available", None)
    if available is None or not available():
        raise DFlashError(f"device {str(device)!r} is not available on this machine; use --device cpu.")
    return dev


def sync_device(device: torch.device) -> None:
    """Wait for queued work on `device` (a no-op on the CPU, where every call is synchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_ISA_FLAGS = ("amx_bf16", "avx512_bf16", "avx512f", "avx2")  # strongest first


@functools.cache  # read once per process: every "auto" request's cost-table key asks for it
def cpu_facts() -> tuple[str, tuple[str, ...]]:
    """(CPU model name, the bf16-relevant ISA flags it has) from /proc/cpuinfo; best effort elsewhere."""
    name, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not name:
                name = value.strip()
            elif key.strip() in ("flags", "Features") and not flags:
                flags = set(value.split())
    except OSError:
        pass
    name = name or platform.processor() or platform.machine() or "unknown CPU"
    return name, tuple(f for f in _ISA_FLAGS if f in flags)
