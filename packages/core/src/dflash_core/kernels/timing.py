"""Timing two or more exact kernels against each other, fairly: the way a kernel here chooses its variant."""

from __future__ import annotations

import time


def fastest_alternating(kernels: dict, repeats: int) -> dict[str, float]:
    """name -> the fastest of `repeats` timed calls of each zero-argument kernel, the kernels called in turn
    (after one untimed round that warms them all up), so none finds its weight hot from its own last call."""
    best = dict.fromkeys(kernels, float("inf"))
    for round_ in range(repeats + 1):
        for name, run in kernels.items():
            started = time.perf_counter()
            run()
            elapsed = time.perf_counter() - started
            if round_:
                best[name] = min(best[name], elapsed)
    return best
