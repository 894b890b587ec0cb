"""Cache rollback keeps exactly the accepted entries; streaming yields what generate returns."""

from __future__ import annotations

import torch
from dflash_core.tuning.plan import Tuning
from dflash_core import DecodeProfile, TargetModel, generate, generate_stream
from dflash_core.tuning.cost_table import VerifyCostTable
from dflash_core.tuning.draft_length import DraftLengthPolicy
from dflash_core.target.cache import TargetCache
from tiny import drafter_config, tiny_drafter, tiny_target


def _fresh_kv(model, tokens):
    target = TargetModel(model)
    cache = TargetCache(1)
    with torch.no_grad():
        target(torch.tensor([tokens]), torch.arange(len(tokens))[None], cache.cache)
    return [(layer.keys[0], layer.values[0]) for layer in cache.cache.layers]


def test_ragged_rollback_equals_prefill_of_accepted_tokens():
    """Rows keep different numbers of a verified block; each row's cache equals a fresh prefill."""
    model = tiny_target(vocab=32, layers=3)
    target = TargetModel(model)
    prompts = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10]]
    blocks = [[11, 12, 13, 14], [15, 16, 17, 18], [19, 20, 21, 22]]
    keep = [1, 4, 2]
    cache = TargetCache(3)
    with torch.no_grad():
        width = max(map(len, prompts))
        ids = torch.tensor([p + [0] * (width - len(p)) for p in prompts])
        pos = torch.arange(width).expand(3, -1)
        valid = pos < torch.tensor([len(p) for p in prompts])[:, None]
        target(ids, pos, cache.cache, cache.attention_mask(target, pos, valid))
        cache.commit(width, [len(p) for p in prompts])
        block_pos = torch.tensor(cache.lengths)[:, None] + torch.arange(4)
        target(torch.tensor(blocks), block_pos, cache.cache, cache.attention_mask(target, block_pos))
        cache.commit(4, keep)
    assert cache.lengths == [6, 6, 5] and cache.slots == 6
    for layer in cache.cache.layers:  # memory: nothing beyond the longest row survives
        assert layer.keys.shape[2] == 6
    for row, (prompt, block, n) in enumerate(zip(prompts, blocks, keep)):
        fresh = _fresh_kv(model, prompt + block[:n])
        for layer, (k, v) in zip(cache.cache.layers, fresh):
            length = len(prompt) + n
            assert torch.allclose(layer.keys[row, :, :length], k, atol=1e-5)
            assert torch.allclose(layer.values[row, :, :length], v, atol=1e-5)


def test_stream_yields_exactly_what_generate_returns():
    model = tiny_target(vocab=6, seed=4)
    drafter = tiny_drafter(drafter_config(model, block_size=6), seed=4)
    ids = torch.tensor([[1, 2, 3], [3, 2, 1]])
    tuning = Tuning()  # one cost table for both runs: their policies then choose alike
    stream = generate_stream(model, drafter, ids, max_new_tokens=25, tuning=tuning)
    pieces = [[], []]
    steps = 0
    for chunk in stream:
        steps += 1
        for row, tokens in enumerate(chunk):
            pieces[row].extend(tokens)
    # a drafter of the same weights: its acceptance history starts as empty as the stream's did
    expected = generate(model, tiny_drafter(drafter_config(model, block_size=6), seed=4), ids, max_new_tokens=25,
                        tuning=tuning)
    assert pieces == expected.tokens == stream.result.tokens
    assert steps == 1 + max(len(a) for a in expected.acceptance_lengths)
    assert stream.result.acceptance_lengths == expected.acceptance_lengths


def test_timings_are_opt_in_and_reported_in_a_profile():
    model = tiny_target(vocab=16)
    drafter = tiny_drafter(drafter_config(model, block_size=4))
    plain = generate(model, drafter, torch.tensor([[1, 2]]), max_new_tokens=12)
    assert not hasattr(plain, "draft_s") and set(plain.to_dict()) == {"tokens", "tau", "acceptance_lengths",
                                                                      "finish_reasons"}
    profile = DecodeProfile()
    result = generate(model, drafter, torch.tensor([[1, 2]]), max_new_tokens=12, profile=profile)
    assert result.tokens == plain.tokens
    assert profile.prefill_s > 0 and profile.draft_s > 0 and profile.verify_s > 0
    assert profile.decode_s >= profile.draft_s + profile.verify_s
    assert profile.steps == len(result.acceptance_lengths[0])
    assert profile.tokens_per_s(result.num_new_tokens) > 0 and len(result.tokens[0]) == 12


def test_the_drafter_reads_the_prompt_only_when_it_first_drafts():
    """A request that ends at its first token, or never drafts, costs no KV injection; one that drafts
    injects the prompt once, before anything else, and its output is the target's either way."""
    model = tiny_target(vocab=32, layers=3)
    drafter = tiny_drafter(drafter_config(model, block_size=4))
    calls = []
    original = drafter.extend_cache
    drafter.extend_cache = lambda cache, features, positions, counts: (
        calls.append((features.shape[1], list(counts))) or original(cache, features, positions, counts))
    prompts = torch.tensor([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]])
    policy = DraftLengthPolicy(VerifyCostTable(seconds=(1.0, 1.05, 1.1, 1.15), draft_s=0.3), 4)  # not measured here
    generate(model, drafter, prompts, max_new_tokens=1, draft_length=policy)
    generate(model, drafter, prompts, max_new_tokens=6, draft_length=0)
    assert calls == []
    drafted = generate(model, drafter, prompts, max_new_tokens=6, draft_length=3)
    assert calls[0] == (6, [6, 6]) and len(calls) >= 2  # the prompts first, then each step's accepted tokens
    plain = generate(model, drafter, prompts, max_new_tokens=6, draft_length=0)
    assert drafted.tokens == plain.tokens
