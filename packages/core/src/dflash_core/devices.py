"""Checking a torch device name before anything is loaded onto it: one sentence instead of torch's assertion."""

from __future__ import annotations

import torch

from .errors import DFlashError


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
