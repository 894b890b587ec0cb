"""The cost model's ceiling: the best speedup a drafter's acceptance allows on this machine.

Given the drafter's per-position acceptance p_i (i = 1..B-1, the chance draft i is accepted when
drafts 1..i-1 were) and the machine's `VerifyCostTable`, a decoder that verified the best number
of drafts k every step would commit E(k) = 1 + sum_{j<=k} prod_{i<=j} p_i tokens per step T(k), where
a plain step commits 1 token in T(0). So no decode loop over these two models, on this machine,
with this acceptance, can beat

    ceiling = max_k  E(k) * T(0) / T(k)        (for r rows: T(k, r) of the table, E(k) * r tokens)

and `measured speedup / ceiling` says how much of what the cost model allows the real loop reached
(its bookkeeping, the policy's exploration and learning, prefill and timing noise are the rest).
p_i is read from steps that verified the whole block (the `dflash_full` method), so every position
is observed, not only those the policy chose to try.
"""

from __future__ import annotations

from typing import Sequence

from dflash_core.tuning.cost_table import VerifyCostTable


def acceptance_by_position(acceptance_lengths: Sequence[Sequence[int]], block_size: int) -> tuple[float, ...]:
    """p_i for i = 1..B-1 from full-block steps: tokens committed per step, one list per row.

    A step that committed a tokens accepted a-1 drafts: positions 1..a-1 were accepted and position a
    (if a <= B-1) rejected. The last step of each row is left out: max_new_tokens or a stop token may
    have cut it. A position no step reached gets 0.
    """
    reached = [0] * (block_size - 1)
    accepted = [0] * (block_size - 1)
    for row in acceptance_lengths:
        for committed in row[:-1]:
            drafts = committed - 1
            for i in range(min(drafts + 1, block_size - 1)):
                reached[i] += 1
                accepted[i] += i < drafts
    return tuple(a / n if n else 0.0 for a, n in zip(accepted, reached))


def expected_tokens(acceptance: Sequence[float]) -> list[float]:
    """E(k) for k = 0..len(acceptance): tokens a step verifying k drafts commits on average."""
    expected, survive = [1.0], 1.0
    for p in acceptance:
        survive *= p
        expected.append(expected[-1] + survive)
    return expected


def ceiling_speedup(costs: VerifyCostTable, acceptance: Sequence[float], rows: int = 1) -> tuple[float, int]:
    """(max_k E(k) T(0, r) / T(k, r), that best k) for `rows` rows decoded together."""
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    expected = expected_tokens(acceptance[: costs.block_size - 1])
    plain = costs.step(0, rows)
    speedups = [e * plain / costs.step(k, rows) for k, e in enumerate(expected)]
    best = max(range(len(speedups)), key=speedups.__getitem__)
    return speedups[best], best
