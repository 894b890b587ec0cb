"""Context lookup: what it copies, and that decoding with it stays the target's own output."""

from __future__ import annotations

import random

import pytest
import torch
from dflash_core import DecodeProfile, generate
from dflash_core.decode.context_lookup import NgramIndex, free_drafting, lookup_continuation
from dflash_core.tuning.cost_table import VerifyCostTable
from dflash_core.tuning.draft_length import DraftLengthPolicy
from test_greedy_lossless import _padded, never_agreeing_pair, target_greedy
from tiny import drafter_config, tiny_drafter, tiny_target


@pytest.mark.parametrize("history,count,expected", [
    ([1, 2, 3, 9, 1, 2], 3, [3, 9, 1]),  # what followed the earlier [1, 2]
    ([5, 7, 5, 7], 5, [5, 7, 5, 7, 5]),  # a loop runs on into its own prediction
    ([1, 2, 3, 8, 2, 3, 9, 1, 2, 3], 2, [8, 2]),  # the longest recurring suffix wins over a later shorter one
    ([4, 5, 1, 4, 5, 2, 4, 5], 3, [2, 4, 5]),  # of equal matches, the most recent
    ([1, 2, 3, 4], 4, []),  # nothing recurs
    ([1, 2, 1], 2, []),  # one repeated token is not a match (min_ngram 2)
    ([7], 3, []),
    ([], 3, []),
])
def test_lookup_continuation(history, count, expected):
    assert lookup_continuation(history, count) == expected


def test_lookup_continuation_bounds():
    assert lookup_continuation([1, 2, 1], 2, min_ngram=1) == [2, 1]
    for bad in ({"count": 0}, {"count": 2, "min_ngram": 0}, {"count": 2, "min_ngram": 3, "max_ngram": 2}):
        with pytest.raises(ValueError, match="lookup needs"):
            lookup_continuation([1, 2, 1, 2], **bad)


def scan(history: list[int], count: int, max_ngram: int = 4, min_ngram: int = 2) -> list[int]:
    """The oracle, by brute force: for n = max..min, the latest earlier start of the last n tokens; what followed."""
    for n in range(min(max_ngram, len(history) - 1), min_ngram - 1, -1):
        starts = [i for i in range(len(history) - n) if history[i : i + n] == history[-n:]]
        if starts:
            copied = history[starts[-1] + n :]
            return [copied[j % len(copied)] for j in range(count)]  # a loop runs on into its own copy
    return []


@pytest.mark.parametrize("seed", range(20))
def test_the_incremental_index_copies_what_the_scan_copies(seed):
    """`NgramIndex`, grown token by token as the decoder grows it, answers as a brute-force scan at every length."""
    rng = random.Random(seed)
    vocab, count = rng.choice([2, 3, 5, 12]), rng.randint(1, 15)
    history = [rng.randrange(vocab) for _ in range(rng.randint(0, 4))]
    index = NgramIndex(history)
    for _ in range(60):
        assert index.continuation(count) == scan(history, count), history
        new = [rng.randrange(vocab) for _ in range(rng.randint(1, 3))]
        history += new
        index.extend(new)
    with pytest.raises(ValueError, match="lookup needs"):
        index.continuation(0)


def test_free_drafting_keeps_the_verify_times():
    costs = VerifyCostTable(seconds=(1.0, 1.5, 2.0), draft_s=0.7, head_s=0.1)
    free = free_drafting(costs)
    assert free.seconds == costs.seconds and free.draft_s == 0.0 and free.head_s == 0.0


def _policy(block: int = 8) -> DraftLengthPolicy:
    """A machine where a drafter pass costs half a target step (the tiny models' own timings are noise)."""
    return DraftLengthPolicy(VerifyCostTable(seconds=tuple(1.0 + 0.05 * q for q in range(block)), draft_s=0.5), block)


def test_a_loop_is_copied_where_the_drafter_never_agrees():
    model, drafter = never_agreeing_pair()
    prompt = [3, 5, 7]
    profile = DecodeProfile()
    result = generate(model, drafter, torch.tensor([prompt]), max_new_tokens=60, draft_length=_policy(),
                      profile=profile)
    assert result.tokens[0] == target_greedy(model, prompt, 60) == [0] * 60
    assert profile.lookup_steps >= 5 and max(result.acceptance_lengths[0]) == 8  # whole blocks of copies
    alone = generate(model, drafter, torch.tensor([prompt]), max_new_tokens=60, draft_length=_policy(),
                     context_lookup=False)
    assert alone.tokens == result.tokens and max(alone.acceptance_lengths[0]) == 1
    assert len(result.acceptance_lengths[0]) < len(alone.acceptance_lengths[0]) / 3


def test_a_fixed_draft_length_drafts_with_the_drafter_only():
    """An int k means k drafter drafts every step (how tau is measured): no lookup then."""
    model, drafter = never_agreeing_pair()
    profile = DecodeProfile()
    result = generate(model, drafter, torch.tensor([[3, 5, 7]]), max_new_tokens=30, draft_length=7, profile=profile)
    assert profile.lookup_steps == 0 and max(result.acceptance_lengths[0]) == 1


def _repetitive_case(seed: int):
    """A random tiny pair decoding a ragged batch of prompts that repeat a motif, lookup on."""
    rng = random.Random(seed)
    vocab = rng.choice([5, 8, 16])
    model = tiny_target(vocab=vocab, layers=2, hidden=32, seed=seed)
    block = rng.choice([2, 4, 8, 16])
    drafter = tiny_drafter(drafter_config(model, block_size=block), seed=seed, std=0.3)
    prompts = []
    for _ in range(rng.choice([1, 2, 3])):
        motif = [rng.randrange(vocab - 1) for _ in range(rng.randint(2, 5))]
        prompts.append((motif * 6)[: rng.randint(2 * len(motif), 24)])  # the motif twice at least
    ids, mask = _padded(prompts, left=seed % 2 == 0)
    max_new = rng.randint(1, 40)
    stop = [rng.randrange(vocab)] if seed % 3 == 0 else None
    profile = DecodeProfile()
    result = generate(model, drafter, ids, attention_mask=mask, max_new_tokens=max_new, stop_token_ids=stop,
                      draft_length=_policy(block), profile=profile)
    return model, prompts, max_new, stop, block, result, profile


@pytest.mark.parametrize("seed", range(16))
def test_lookup_on_repetitive_ragged_batches_matches_target(seed):
    model, prompts, max_new, stop, block, result, _ = _repetitive_case(seed)
    for row, prompt in enumerate(prompts):
        assert result.tokens[row] == target_greedy(model, prompt, max_new, stop), f"row {row}"
        assert all(1 <= a <= block for a in result.acceptance_lengths[row])


def test_the_repetitive_sweep_really_copies():
    """The sweep above is not vacuous: copies are drafted, and accepted several at a time."""
    cases = [_repetitive_case(seed) for seed in range(16)]
    assert sum(c[-1].lookup_steps >= 1 for c in cases) >= 8
    assert max(a for c in cases for row in c[-2].acceptance_lengths for a in row) >= 4


def _check_drafter_context(seed: int) -> int:
    """Decode a repetitive ragged batch for five steps; check the drafter's context; return the copied steps."""
    from dflash_core import TargetModel, generate_stream
    from dflash_core.decode.sources import DrafterSource

    rng = random.Random(seed)
    model = tiny_target(vocab=6, layers=2, hidden=32, seed=seed)
    drafter = tiny_drafter(drafter_config(model, block_size=8), seed=seed, std=0.3)
    prompts = [([1, 2, 3] * 5)[: rng.randint(6, 15)], ([4, 1] * 6)[: rng.randint(4, 12)], [2, 5, 2, 5, 2, 5]]
    ids, mask = _padded(prompts, left=False)
    profile = DecodeProfile()
    stream = generate_stream(model, drafter, ids, attention_mask=mask, max_new_tokens=40, draft_length=_policy(),
                             profile=profile)
    steps = iter(stream)
    for _ in range(6):  # prefill and five steps; every row still active (40 tokens are far)
        next(steps)
    decoder = stream._decoder
    source = next(s for s in decoder.chooser.sources if isinstance(s, DrafterSource))
    source._inject_pending()
    target = TargetModel(model, drafter.config.target_layer_ids)
    for i, row in enumerate(decoder.rows.ids):
        seen = prompts[row] + stream.result.tokens[row][:-1]  # the newest token is not verified yet
        with torch.no_grad():
            features = target(torch.tensor([seen]), torch.arange(len(seen))[None], None).features
        fresh = drafter.new_cache(1, 64)
        drafter.extend_cache(fresh, features, torch.arange(len(seen))[None], [len(seen)])
        assert source.cache.lengths[i] == len(seen)
        for got, want in zip(source.cache.context(), fresh.context()):
            assert torch.allclose(got[:, i, :, : len(seen)], want[:, 0], atol=1e-5), (seed, row)
    return profile.lookup_steps


@pytest.mark.parametrize("seed", range(6))
def test_the_drafter_context_after_copied_steps_is_the_committed_history(seed):
    """Tokens committed by copies reach the drafter's context as those of any step (deferred, packed per row):
    mid-request, its K/V equal a fresh injection of the features of every token the target has verified."""
    _check_drafter_context(seed)


def test_the_context_check_covers_copied_steps():
    assert sum(_check_drafter_context(seed) >= 1 for seed in range(6)) >= 3


def test_a_copy_passed_over_for_the_drafter_is_scored_against_what_the_target_committed():
    """Where the drafter drafted although the row had a copy, the copy's outcome is read off the committed tokens
    (greedy): its lookup policy keeps learning while it is not chosen, instead of starving on old rejections."""
    from dflash_core.decode.choice import shadow_outcome as _shadow_outcome

    assert _shadow_outcome([5, 6, 7], [5, 6, 9]) == (3, 2)  # 2 accepted, the third rejected
    assert _shadow_outcome([4], [5, 1]) == (1, 0)
    assert _shadow_outcome([5, 6, 7], [5, 6]) == (2, 2)  # the step committed 2: nothing known past them
    assert _shadow_outcome([5, 6], [5, 6, 9, 9]) == (2, 2)  # the copy ends first
