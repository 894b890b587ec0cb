"""Opt-in timing of a decode: where the time of `generate` went.

The decode loop reads no clock and synchronises no device unless the caller hands it a
`DecodeProfile`; with one, each phase is closed by a device sync so that asynchronous CUDA work
is charged to the phase that queued it. Outputs (`GenerationResult`) never carry timings.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from dflash_core.devices import sync_device


@dataclass(frozen=True)
class StepRecord:
    """One verify step of a decode, as `DecodeProfile.step_log` keeps it (for pricing: `dflash_bench.modeled`)."""

    source: str
    """Who drafted: "drafter", "lookup" (a copy from the row's context) or "plain" (no drafts)."""
    drafts: int
    """Drafts verified per row (k; a lookup step pads rows to the longest copy)."""
    committed: tuple[int, ...]
    """Per row, the tokens the target verified as its own (accepted drafts + its own next token)."""


@dataclass
class DecodeProfile:
    """Seconds spent per phase of one `generate` call (filled by the loop; summed over rows)."""

    prefill_s: float = 0.0
    draft_s: float = 0.0
    """Drafter passes plus KV injection of accepted tokens."""
    verify_s: float = 0.0
    """Target forwards over the verified blocks (or single tokens) and token choice."""
    decode_s: float = 0.0
    """Everything after prefill, loop bookkeeping included."""
    steps: int = 0
    drafter_steps: int = 0
    """Steps (of `steps`) whose drafts came from the drafter's pass."""
    lookup_steps: int = 0
    """Steps (of `steps`) whose drafts were copied from the context (`dflash_core.decode.context_lookup`)."""
    trimmed_steps: int = 0
    """Steps (of `steps`) that verified fewer drafts than were drafted, by the drafter's confidence
    (`dflash_core.decode.draft_confidence`; a step trimmed to none is a plain step after a drafter pass)."""
    tree_steps: int = 0
    """Steps (of `drafter_steps`) that verified a token tree (`dflash_core.decode.tree`)."""
    tree_nodes: int = 0
    """Nodes of those trees, summed (per row: rows of one step share the size)."""
    step_log: list[StepRecord] | None = None
    """None (default), or a list each step appends its `StepRecord` to (kept for pricing, no clock needed)."""

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def overhead_s(self) -> float:
        """Decode time spent outside the drafter and target forwards (the loop's own cost)."""
        return max(0.0, self.decode_s - self.draft_s - self.verify_s)

    def tokens_per_s(self, new_tokens: int) -> float:
        """`new_tokens` per second of wall time, prefill included."""
        return new_tokens / self.total_s if self.total_s > 0 else 0.0

    def to_dict(self) -> dict:
        return asdict(self) | {"total_s": self.total_s, "overhead_s": self.overhead_s}


class PhaseClock:
    """Charges elapsed time to profile fields; inert (no clock, no sync) when profile is None."""

    def __init__(self, profile: DecodeProfile | None, device: torch.device) -> None:
        self.profile, self.device = profile, device
        self.started = 0.0

    def start(self) -> None:
        if self.profile is not None:
            self.started = time.perf_counter()

    def charge(self, field: str) -> None:
        """Add the time since the last start/charge to `field`, after a device sync."""
        if self.profile is None:
            return
        sync_device(self.device)
        now = time.perf_counter()
        setattr(self.profile, field, getattr(self.profile, field) + now - self.started)
        self.started = now
