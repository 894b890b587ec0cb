"""Training that starts from an existing drafter's weights (`dflash train --init-from DRAFTER`).

Continuing a trained drafter on other data (more prompts, the target's sampled responses, a user's own
domain) costs a fraction of training anew. The drafter this run builds (from the target and the
recipe's flags) must be exactly the one given, shape and wiring alike: a mismatch is refused, naming
the fields, rather than loaded in part. Only the weights are taken: the optimizer, the schedule and
the read-out list start fresh, from this run's settings and data.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from dflash_core.model.drafter import Drafter, load_drafter
from dflash_core.errors import ConfigError

_IGNORED = ("dtype", "torch_dtype")  # the weights are cast to the run's precision anyway


@torch.no_grad()
def init_from_drafter(drafter: Drafter, path: str | os.PathLike) -> None:
    """Copy the weights of the published-format drafter at `path` into `drafter` (same config) in place."""
    source = load_drafter(path, device=drafter.fc.weight.device, dtype=drafter.fc.weight.dtype)
    mine = {k: v for k, v in drafter.config.to_dict().items() if k not in _IGNORED}
    theirs = {k: v for k, v in source.config.to_dict().items() if k not in _IGNORED}
    differ = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    if differ:
        shown = ", ".join(f"{k} ({theirs.get(k)!r} there, {mine.get(k)!r} here)" for k in differ[:3])
        raise ConfigError(f"--init-from {Path(path)} is not the drafter this run builds: it differs in {shown}; "
                          "expected matching --layers, --block-size, --target-layer-ids/--feature-layers and mask token.")
    drafter.load_state_dict(source.state_dict(), strict=True)
