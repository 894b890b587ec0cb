"""`Tuning`: what decoding measures and learns about this machine, held by the caller, cached where it says.

A library call never measures behind the caller's back into a file or a process-wide table: every
measurement that outlives one `generate` call lives in a `Tuning` object the caller holds.

- `Tuning()` keeps everything in memory: the verify cost table of each pair (measured on first use, a
  few forwards), the acceptance history of each drafter and draft source, and how its token trees were
  accepted. Nothing is read or written.
- `Tuning.cached()` also reads and writes the cache directory (`$DFLASH_CACHE_DIR`, else
  `$XDG_CACHE_HOME/dflash`, else `~/.cache/dflash`): `cost_tables.json` and the dtype probe's
  `dtype_probe.json`, so the next process skips the measurement. The `dflash` command uses it unless
  given `--no-cache`.

`load_pair(..., tuning=...)` probes the dtype through it and returns it as `Pair.tuning`;
`generate(..., tuning=pair.tuning)` reuses its tables and histories. `generate` without one makes a
fresh in-memory `Tuning` for that call alone (it measures the cost table again each call).
"""

from __future__ import annotations

import copy
import os
import weakref
from pathlib import Path

from dflash_core.sampling.tokens import SamplingParams
from dflash_core.target.adapter import TargetModel
from dflash_core.tuning.auto_dtype import default_cache_dir
from dflash_core.tuning.cost_table import VerifyCostTable, cost_table_for, cost_table_key, spot_times
from dflash_core.tuning.draft_length import AcceptanceHistory
from dflash_core.tuning.tree_calibration import Calibration

SOURCES = ("drafter", "lookup")  # the draft sources whose acceptance a history is kept of


class Tuning:
    """This machine's measurements for decoding (cost tables) and what earlier requests taught (histories)."""

    def __init__(self, cache_dir: str | os.PathLike | None = None) -> None:
        self.cache_dir = None if cache_dir is None else Path(cache_dir)
        """Where cost tables and dtype probes are read and written; None: memory only."""
        self._tables: dict[str, VerifyCostTable] = {}
        self._histories: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # drafter -> {source: history}

    @classmethod
    def cached(cls, cache_dir: str | os.PathLike | None = None) -> "Tuning":
        """A Tuning kept across processes in `cache_dir` (default: the user's dflash cache directory)."""
        return cls(default_cache_dir() if cache_dir is None else cache_dir)

    def __repr__(self) -> str:
        return f"Tuning(cache_dir={str(self.cache_dir) if self.cache_dir else None!r})"

    def cost_table(self, target: TargetModel, drafter, sampling: SamplingParams | None = None, *,
                   spot=spot_times) -> VerifyCostTable:
        """The pair's verify cost table for this way of choosing tokens: measured (or read from the cache
        directory) on first use, kept in this object after."""
        key = cost_table_key(target, drafter, None if sampling is None or sampling.greedy else sampling)
        if key not in self._tables:
            self._tables[key] = cost_table_for(target, drafter, sampling=sampling, cache_dir=self.cache_dir,
                                               spot=spot, key=key)
        return self._tables[key]

    def history(self, drafter, source: str = "drafter") -> AcceptanceHistory:
        """The acceptance history of greedy requests' `source` ("drafter", or "lookup": context lookup beside
        this drafter), kept as long as this object and the drafter both live."""
        if source not in SOURCES:
            raise ValueError(f"draft source {source!r} is not one of {', '.join(SOURCES)}")
        histories = self._histories.setdefault(drafter, {})
        if source not in histories:
            histories[source] = AcceptanceHistory(drafter.config.block_size - 1)
        return histories[source]

    def tree_calibration(self, drafter) -> Calibration:
        """How greedy requests' token trees beside this drafter were accepted (`tree_calibration`), kept with
        its histories (and saved and restored with them)."""
        histories = self._histories.setdefault(drafter, {})
        if "tree" not in histories:
            histories["tree"] = Calibration()
        return histories["tree"]

    def saved_histories(self, drafter) -> dict[str, AcceptanceHistory]:
        """A copy of `drafter`'s histories (every source), for `restore_histories`."""
        return copy.deepcopy(self._histories.get(drafter, {}))

    def restore_histories(self, drafter, saved: dict[str, AcceptanceHistory]) -> None:
        """Make `drafter`'s histories what `saved_histories` copied (a copy again: `saved` stays reusable).

        For benchmarks: each method keeps its own history and every repeat of a request starts from the same
        one, as in a process that serves only that method and sees each request once."""
        self._histories[drafter] = copy.deepcopy(saved)
