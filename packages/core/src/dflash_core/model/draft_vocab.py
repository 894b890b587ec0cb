"""The drafts' read-out vocabulary: the tokens the target actually writes, not all of its vocabulary.

A drafter's hidden states become draft tokens through the target's LM head. Read out over the whole
vocabulary, that head is the largest weight a drafting step touches (the demo target's 8,192 x 384
head outweighs the whole 1-layer drafter), although the target's own outputs use a small part of it:
its greedy responses in the demo training data use 2,566 distinct tokens, and the 2,048 most frequent
cover 99.95% of them. So a drafter may carry `draft_vocab.json`, the ids the target writes most, and
drafts are read out over those rows only (as EAGLE-3's draft vocabulary and FR-Spec do).

Losslessness is untouched: a draft is still one deterministic token per position that the target
verifies; a token outside the list is simply never proposed (the target writes it at that step).
Drafters without the file (the published ones) read out over the whole vocabulary, and so does every
sampling request (temperature > 0, `draft_sampling`): the list holds what the target writes greedily,
and drafts sampled from a q cut to it would never propose the rarer tokens a sample takes. The exception
is a drafter whose training loss ran over the list only (`dflash train --loss-vocab list`): its logits
outside the list were never trained, so its sampled q is cut to the list too (`sampling_head_for`; any q
keeps sampling exact, `draft_sampling`).

File: {"token_ids": [...], "coverage": c, "source": "...", "sampled_over_list": true}; ids unique, in
[0, vocab), sorted; coverage (the share of the training responses covered) is absent when unknown;
sampled_over_list (absent: false) is set by a training run whose loss ran over the list.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch

from dflash_core.errors import CheckpointError
from dflash_core.files.atomic import write_json
from dflash_core.kernels.matmul_layout import MatmulLayouts
from dflash_core.kernels.packed_weights import DECODE_LINEARS
from dflash_core.sampling.tokens import greedy_tokens
from dflash_core.files.text import read_json_object

DRAFT_VOCAB_FILE = "draft_vocab.json"
DEFAULT_COVERAGE = 0.999  # share of the target's response tokens the list must cover
ROUND_TO = 64  # list lengths are multiples of this (matmul-friendly row counts)

ReadOut = Callable[[torch.Tensor], torch.Tensor]  # drafter hidden states [B, k, H] -> draft tokens [B, k]


def count_tokens(responses: Iterable[np.ndarray], vocab_size: int) -> np.ndarray:
    """How often each id occurs in the given response token arrays: [vocab_size] int64."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for tokens in responses:
        counts += np.bincount(np.asarray(tokens, dtype=np.int64), minlength=vocab_size)[:vocab_size]
    return counts


def choose_draft_vocab(counts: np.ndarray, coverage: float = DEFAULT_COVERAGE) -> tuple[list[int], float]:
    """The most frequent ids whose counts reach `coverage` of the total, rounded up to a multiple of
    ROUND_TO (ties by id); returns (sorted ids, the share of counts they cover)."""
    if not 0.0 < coverage <= 1.0:
        raise ValueError(f"coverage must be in (0, 1], got {coverage}")
    total = int(counts.sum())
    if total == 0:
        raise ValueError("no tokens were counted: a draft vocabulary needs the target's responses")
    order = np.lexsort((np.arange(len(counts)), -counts))  # most frequent first, lower id first on ties
    cumulative = np.cumsum(counts[order])
    needed = int(np.searchsorted(cumulative, coverage * total - 1e-9)) + 1
    size = min(len(counts), -(-needed // ROUND_TO) * ROUND_TO)
    ids = sorted(int(i) for i in order[:size])
    return ids, float(cumulative[size - 1]) / total


def save_draft_vocab(directory: str | os.PathLike, ids: list[int], coverage: float | None, source: str,
                     sampled_over_list: bool = False) -> Path:
    """Write `draft_vocab.json` atomically; `coverage` None (unknown, e.g. a loaded list saved again) is left out."""
    path = Path(directory) / DRAFT_VOCAB_FILE
    data = {"token_ids": sorted(ids), "source": source}
    if coverage is not None:
        data["coverage"] = round(coverage, 6)
    if sampled_over_list:
        data["sampled_over_list"] = True
    write_json(path, data)
    return path


def load_draft_vocab(directory: str | os.PathLike, vocab_size: int | None = None) -> list[int] | None:
    """The ids of a drafter directory's `draft_vocab.json`, or None when it has none (whole vocabulary)."""
    return read_draft_vocab(directory, vocab_size)[0]


def read_draft_vocab(directory: str | os.PathLike, vocab_size: int | None = None) -> tuple[list[int] | None, bool]:
    """(the ids of a drafter directory's `draft_vocab.json` or None, whether sampled drafts use the list too)."""
    path = Path(directory) / DRAFT_VOCAB_FILE
    if not path.is_file():
        return None, False
    expected = 'an object {"token_ids": [unique ids in the target vocabulary], ...}'
    data = read_json_object(path, CheckpointError, expected)
    sampled = data.get("sampled_over_list", False)
    if not isinstance(sampled, bool):
        raise CheckpointError(f"{path}: 'sampled_over_list' is {sampled!r}, expected true or false.")
    ids = data.get("token_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise CheckpointError(f"{path}: 'token_ids' must be a non-empty list of integers, expected {expected}.")
    if len(set(ids)) != len(ids):
        raise CheckpointError(f"{path}: 'token_ids' repeats an id, expected {expected}.")
    bad = [i for i in ids if i < 0 or (vocab_size is not None and i >= vocab_size)]
    if bad:
        limit = "" if vocab_size is None else f" [0, {vocab_size})"
        raise CheckpointError(f"{path}: token id {bad[0]} is outside the target's vocabulary{limit}.")
    return sorted(ids), sampled


def full_read_out(lm_head: Callable[[torch.Tensor], torch.Tensor]) -> ReadOut:
    """Drafts over the whole vocabulary: argmax of the target's LM head."""
    return lambda hidden: greedy_tokens(lm_head(hidden))


def read_out_for(drafter, target) -> ReadOut:
    """The read-out decoding uses for this pair: over the drafter's `draft_vocab` when it has one,
    else the whole vocabulary. The subset's rows are copied once per head and kept on the drafter;
    a drafter decoding with fp16-packed or bf16 weight copies (`Drafter.use_weight_format`) reads out
    through such a copy of the rows too."""
    ids = getattr(drafter, "draft_vocab", None)
    if ids is None:
        return full_read_out(draft_head_for(drafter, target))
    head = target.model.lm_head
    weight_format = _decoding_format(drafter)
    key = (head.weight.data_ptr(), head.weight._version, head.weight.dtype, tuple(ids))
    # one per weight format, so switching formats (`dflash bench`'s dflash_plain_weights) rebuilds nothing
    kept = drafter.__dict__.setdefault("_subset_read_outs", {})
    cached = kept.get(weight_format)
    if cached is None or cached[0] != key:
        cached = kept[weight_format] = (key, SubsetReadOut(head, ids, weight_format=weight_format))
    return cached[1]


def read_out_logits(drafter, target) -> tuple[Callable[[torch.Tensor], torch.Tensor], torch.Tensor | None]:
    """(logits, ids) of `read_out_for`'s read-out, for read-outs that keep more than the argmax: hidden ->
    logits over the drafter's list (column j is token ids[j]), or over the whole vocabulary (ids None)."""
    read_out = read_out_for(drafter, target)
    if isinstance(read_out, SubsetReadOut):
        return read_out.logits, read_out.ids
    return draft_head_for(drafter, target), None


def draft_head_for(drafter, target) -> Callable[[torch.Tensor], torch.Tensor]:
    """The LM head drafts are read out through over the whole vocabulary (sampled drafts' q, drafters
    without a list): the target's own, or for a drafter decoding with fp16-packed or bf16 weight copies such
    a copy of it (made once per head and format, kept on the drafter). The target's verify always uses its
    own head."""
    weight_format = _decoding_format(drafter)
    if weight_format == "plain":
        return target.logits
    head = target.model.lm_head
    key = (head.weight.data_ptr(), head.weight._version)
    kept = drafter.__dict__.setdefault("_head_copies", {})
    cached = kept.get(weight_format)
    if cached is None or cached[0] != key:
        cached = kept[weight_format] = (key, DECODE_LINEARS[weight_format](head.weight, head.bias))
    return cached[1]


def sampling_head_for(drafter, target) -> Callable[[torch.Tensor], torch.Tensor]:
    """The logits sampled drafts draw from ([B, k, H] -> [B, k, V]): `draft_head_for`'s over the whole
    vocabulary, or for a drafter trained over its read-out list (`sample_over_list`) the listed rows only,
    -inf elsewhere (so q is zero outside the list and its drafts never leave it)."""
    if getattr(drafter, "draft_vocab", None) is None or not getattr(drafter, "sample_over_list", False):
        return draft_head_for(drafter, target)
    subset = read_out_for(drafter, target)
    vocab = target.model.lm_head.weight.shape[0]

    def listed_logits(hidden: torch.Tensor) -> torch.Tensor:
        listed = subset.logits(hidden).float()  # [B, k, N]
        full = listed.new_full((*listed.shape[:-1], vocab), float("-inf"))
        return full.index_copy_(-1, subset.ids, listed)

    return listed_logits


def _decoding_format(drafter) -> str:
    return getattr(drafter, "decoding_format", "plain")  # other backends (ONNX Runtime) have no such format


class SubsetReadOut:
    """Drafts over a list of ids: argmax over those rows of the LM head, mapped back to token ids.

    Holds a contiguous copy of the rows ([N, H], same dtype and device as the head), made once, and
    with `weight_format` "fp16-packed" or "bf16" such a copy of them it multiplies by instead (`packed_weights`).
    """

    def __init__(self, head: torch.nn.Linear, ids: list[int], *, weight_format: str = "plain") -> None:
        index = torch.tensor(ids, dtype=torch.long, device=head.weight.device)
        if int(index.max()) >= head.weight.shape[0]:
            raise CheckpointError(f"draft vocabulary id {int(index.max())} is outside the target's LM head "
                                  f"({head.weight.shape[0]} rows): expected the drafter's own target.")
        self.ids = index  # [N]: logits column j is token ids[j]
        self.weight = head.weight.detach().index_select(0, index).contiguous()  # [N, H]
        self.bias = None if head.bias is None else head.bias.detach().index_select(0, index)
        copy = DECODE_LINEARS.get(weight_format)
        self.packed = None if copy is None else copy(self.weight, self.bias)  # fp16-packed / bf16 rows, or None
        self.layouts = MatmulLayouts()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., N]: the listed rows of the LM head only."""
        if self.packed is not None:
            return self.packed(hidden)
        return self.layouts(hidden, self.weight, self.bias)  # one 2D matmul, in the layout fastest here

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.ids[greedy_tokens(self.logits(hidden))]
