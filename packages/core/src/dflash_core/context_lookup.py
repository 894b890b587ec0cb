"""Context lookup: drafts copied from the row's own history, a second draft source beside the drafter.

Where the output repeats what came before (a loop, an identifier used again, a line of the prompt
quoted back), the tokens that followed the last earlier occurrence of the row's latest n-gram are
very likely to follow again. That is prompt lookup decoding (Hugging Face's `prompt_lookup_num_tokens`),
here over prompt and output alike. It costs no model pass, so where it is right it beats any drafter
on cost, and a block drafter with one layer copies long loops poorly (docs/benchmarks.md).

The decode loop keeps one `DraftLengthPolicy` per source: the drafter's over the machine's cost
table, the lookup's over the same table with drafting free (`free_drafting`). Each step, when some
row has a lookup continuation, the source whose best k promises more committed tokens per second
drafts (the lookup's budgeted retries included, so a source that failed is tried again now and
then). Verification is the same target pass either way: a lookup draft is a fixed token like a
drafter's argmax, so greedy output stays the target's and sampling stays exact rejection sampling.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .draft_length import VerifyCostTable

MAX_NGRAM = 4  # the longest suffix looked up first: a longer match is a surer one
MIN_NGRAM = 2  # a single repeated token says little about what follows it


def lookup_continuation(history: Sequence[int], count: int, *, max_ngram: int = MAX_NGRAM,
                        min_ngram: int = MIN_NGRAM) -> list[int]:
    """Up to `count` tokens predicted to follow `history`, or [] when no suffix n-gram recurs.

    The longest suffix of n tokens (n = max_ngram down to min_ngram) that also occurs earlier; its
    most recent earlier occurrence at i predicts history[i + n], history[i + n + 1], ... Past the end
    of the history the prediction continues with itself, so a loop of period p < count is drafted
    for all `count` tokens (occurrence at distance p: the copy runs on into its own output).
    """
    if count < 1 or min_ngram < 1 or max_ngram < min_ngram:
        raise ValueError(f"lookup needs count >= 1 and 1 <= min_ngram <= max_ngram, got {count}, "
                         f"{min_ngram}, {max_ngram}")
    tokens = np.asarray(history, dtype=np.int64)
    length = len(tokens)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)  # [length - n, n]: starts 0..length-n-1
        starts = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
        if starts.size:
            source = int(starts[-1]) + n  # the token after the most recent earlier occurrence
            copied = tokens[source:].tolist()  # what followed it, up to now
            while len(copied) < count:  # a loop continues into its own prediction
                copied += copied[: count - len(copied)]
            return copied[:count]
    return []


class NgramIndex:
    """One row's history, indexed so that `continuation` equals `lookup_continuation(history, count)`.

    For every n-gram (n = min_ngram..max_ngram) the position right after its latest occurrence whose
    next token is known: an update per committed token and a dict look-up per query, instead of a scan
    of the whole history every step for every row (4% of a step at batch 16 on the demo pair).
    """

    def __init__(self, tokens: Sequence[int] = (), *, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM) -> None:
        if min_ngram < 1 or max_ngram < min_ngram:
            raise ValueError(f"lookup needs 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.tokens: list[int] = []
        self.after: dict[tuple[int, ...], int] = {}  # n-gram -> the position that followed its latest occurrence
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            end = len(self.tokens)  # the n-grams ending just before `token` are now followed by position `end`
            for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                self.after[tuple(self.tokens[end - n : end])] = end
            self.tokens.append(int(token))

    def continuation(self, count: int) -> list[int]:
        """Up to `count` predicted next tokens, or []: see `lookup_continuation`."""
        if count < 1:
            raise ValueError(f"lookup needs count >= 1, got {count}")
        tokens = self.tokens
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            source = self.after.get(tuple(tokens[-n:]))
            if source is not None:
                copied = tokens[source : source + count]
                while len(copied) < count:  # a loop continues into its own prediction
                    copied += copied[: count - len(copied)]
                return copied
        return []


def free_drafting(costs: VerifyCostTable) -> VerifyCostTable:
    """The cost table of lookup drafts: the same verify times, no drafter pass and no LM-head read-out."""
    return VerifyCostTable(seconds=costs.seconds, draft_s=0.0, head_s=0.0)
