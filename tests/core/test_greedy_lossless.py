"""Greedy speculative output == the target's own greedy decoding, token for token."""

from __future__ import annotations

import math
import random

import pytest
import torch
from dflash_core import GenerationError, generate, generate_autoregressive
from dflash_core.tuning.cost_table import VerifyCostTable
from dflash_core.tuning.draft_length import DraftLengthPolicy
from tiny import ARCHS, drafter_config, tiny_drafter, tiny_target


def target_greedy(model, prompt: list[int], max_new_tokens: int, stop=None) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=stop, pad_token_id=0)
    tokens = out[0, len(prompt):].tolist()
    if stop is not None:  # generate pads finished rows; keep up to the first stop token
        for i, t in enumerate(tokens):
            if t in stop:
                return tokens[: i + 1]
    return tokens


def _case(seed: int):
    rng = random.Random(seed)
    arch = rng.choice(sorted(ARCHS))
    vocab = rng.choice([4, 6, 12, 64])
    layers = rng.choice([2, 3, 5])
    model = tiny_target(arch, vocab=vocab, layers=layers, hidden=32, seed=seed)
    block = rng.randint(2, 32)
    d_layers = rng.choice([1, 2])
    ids = tuple(sorted(rng.sample(range(layers), min(layers, rng.choice([1, 2])))))
    cfg = drafter_config(model, layers=d_layers, block_size=block, layer_ids=ids)
    drafter = tiny_drafter(cfg, seed=seed, std=rng.choice([0.05, 0.3]))
    batch = rng.choice([1, 1, 2, 3])
    prompts = [[rng.randrange(vocab - 1) for _ in range(rng.randint(1, 20))] for _ in range(batch)]
    max_new = rng.randint(1, 40)
    stop = [rng.randrange(vocab)] if rng.random() < 0.3 else None
    return model, drafter, prompts, max_new, stop


def _padded(prompts, left: bool):
    width = max(len(p) for p in prompts)
    ids, mask = [], []
    for p in prompts:
        pad = [0] * (width - len(p))
        ids.append(pad + p if left else p + pad)
        mask.append([0] * len(pad) + [1] * len(p) if left else [1] * len(p) + [0] * len(pad))
    return torch.tensor(ids), torch.tensor(mask)


def _draft_length(seed: int, block: int):
    """Every kind of k over the sweep: the cost-aware policy, plain steps, fixed k, the full block."""
    choice = seed % 4
    return ["auto", 0, random.Random(seed).randrange(1, block), block - 1][choice]


@pytest.mark.parametrize("seed", range(60))
def test_random_sweep_matches_target(seed):
    model, drafter, prompts, max_new, stop = _case(seed)
    ids, mask = _padded(prompts, left=seed % 2 == 0)
    k = _draft_length(seed, drafter.config.block_size)
    result = generate(model, drafter, ids, attention_mask=mask, max_new_tokens=max_new, stop_token_ids=stop,
                      draft_length=k)
    for row, prompt in enumerate(prompts):
        assert result.tokens[row] == target_greedy(model, prompt, max_new, stop), f"row {row}"
        limit = drafter.config.block_size if k == "auto" else k + 1
        assert all(1 <= a <= limit for a in result.acceptance_lengths[row])
        assert sum(result.acceptance_lengths[row]) + 1 == len(result.tokens[row])


def test_sweep_exercises_multi_token_acceptance():
    """The sweep above is not vacuous: drafts are really accepted, several per step."""
    longest = 0
    for seed in range(60):
        model, drafter, prompts, max_new, stop = _case(seed)
        ids, mask = _padded(prompts, left=False)
        result = generate(model, drafter, ids, attention_mask=mask, max_new_tokens=max_new, stop_token_ids=stop,
                          draft_length=drafter.config.block_size - 1)
        longest = max([longest] + [a for row in result.acceptance_lengths for a in row])
    assert longest >= 4


def _always_zero(model, drafter):
    """Target and drafter that both always pick token 0: every draft is accepted."""
    with torch.no_grad():
        model.model.norm.weight.zero_()
        drafter.norm.weight.zero_()
    return model, drafter


@pytest.mark.parametrize("block", [2, 3, 8, 16, 32])
@pytest.mark.parametrize("max_new", [1, 5, 16, 33])
def test_max_new_tokens_cuts_a_fully_accepted_block(block, max_new):
    model = tiny_target(vocab=16)
    model, drafter = _always_zero(model, tiny_drafter(drafter_config(model, block_size=block)))
    result = generate(model, drafter, torch.tensor([[3, 5, 7]]), max_new_tokens=max_new, draft_length=block - 1)
    assert result.tokens[0] == [0] * max_new == target_greedy(model, [3, 5, 7], max_new)
    if max_new > 1:
        assert result.acceptance_lengths[0][0] == min(block, max_new - 1)
    assert result.finish_reasons == ["length"]


@pytest.mark.parametrize("block", list(range(2, 33)))
def test_every_block_size_with_length_one_prompt(block):
    model = tiny_target(vocab=6, seed=block)
    drafter = tiny_drafter(drafter_config(model, block_size=block), seed=block)
    result = generate(model, drafter, torch.tensor([[2]]), max_new_tokens=24)
    assert result.tokens[0] == target_greedy(model, [2], 24)


def test_stop_token_mid_block():
    model = tiny_target(vocab=6, seed=3)
    drafter = tiny_drafter(drafter_config(model, block_size=8), seed=3)
    prompt = [1, 2, 3]
    reference = target_greedy(model, prompt, 40)
    hits = 0
    for stop in set(reference[2:]):
        result = generate(model, drafter, torch.tensor([prompt]), max_new_tokens=40, stop_token_ids=[stop],
                          draft_length=7)
        want = target_greedy(model, prompt, 40, [stop])
        assert result.tokens[0] == want and result.finish_reasons == ["stop"]
        # the stop ended a step that had accepted more tokens than it committed
        hits += result.acceptance_lengths[0][-1] < drafter.config.block_size
    assert hits > 0


def test_rows_finish_on_their_own():
    model = tiny_target(vocab=6, seed=8)
    drafter = tiny_drafter(drafter_config(model, block_size=6), seed=8)
    prompts = [[1], [2, 3, 4, 5, 1], [4, 4]]
    stop = [target_greedy(model, prompts[1], 30)[3]]
    ids, mask = _padded(prompts, left=True)
    result = generate(model, drafter, ids, attention_mask=mask, max_new_tokens=30, stop_token_ids=stop)
    for row, prompt in enumerate(prompts):
        assert result.tokens[row] == target_greedy(model, prompt, 30, stop)
    assert "stop" in result.finish_reasons


@pytest.mark.parametrize("seed", [2, 3, 4])
def test_bf16_equals_the_target_or_parts_only_at_a_rounding_tie(seed):
    """In bf16 a 8-token verify and a 1-token forward round differently: outputs may part, but only
    where the target's two competing logits are within bf16 rounding of each other."""
    model = tiny_target(vocab=64, dtype=torch.bfloat16, seed=seed)
    drafter = tiny_drafter(drafter_config(model, block_size=8), seed=seed, dtype=torch.bfloat16)
    prompt = [1, 2, 3, 4]
    spec = generate(model, drafter, torch.tensor([prompt]), max_new_tokens=20).tokens[0]
    alone = generate_autoregressive(model, torch.tensor([prompt]), max_new_tokens=20).tokens[0]
    assert len(spec) == len(alone) == 20
    parted = next((i for i, (a, b) in enumerate(zip(spec, alone)) if a != b), None)
    if parted is not None:
        with torch.no_grad():
            logits = model(torch.tensor([prompt + alone[:parted]])).logits[0, -1].float()
        gap = abs(float(logits[spec[parted]] - logits[alone[parted]]))
        step = 2.0 ** (math.floor(math.log2(abs(float(logits[alone[parted]])) + 1e-30)) - 7)  # one bf16 ulp
        assert gap <= 4 * step, f"outputs part at token {parted} with a logit gap of {gap}, not a rounding tie"


def test_draft_length_is_checked():
    model = tiny_target(vocab=16)
    drafter = tiny_drafter(drafter_config(model, block_size=4))
    for bad in (4, -1, "3", 1.5, True):
        with pytest.raises(GenerationError, match="draft_length"):
            generate(model, drafter, torch.tensor([[1, 2]]), max_new_tokens=4, draft_length=bad)


def never_agreeing_pair():
    """A target that always picks token 0 and a drafter (block 8) that never does."""
    model = tiny_target(vocab=16)
    drafter = tiny_drafter(drafter_config(model, block_size=8))
    with torch.no_grad():
        model.model.norm.weight.zero_()  # target hidden 0: all logits tie, its argmax is always token 0
        head = model.lm_head.weight
        head.zero_()
        head[1, 0], head[2, 0] = 10.0, -10.0  # the drafter's hidden (feature 0 only) picks 1 or 2, never 0
        drafter.norm.weight.zero_()
        drafter.norm.weight[0] = 1.0
    return model, drafter


def test_auto_draft_length_backs_off_a_drafter_that_never_agrees():
    """A drafter whose drafts are always rejected soon costs plain target steps (k = 0), still lossless."""
    model, drafter = never_agreeing_pair()
    calls = []
    original = drafter.propose
    drafter.propose = lambda *args: calls.append(args[-1]) or original(*args)  # records k, drafts as before
    full = generate(model, drafter, torch.tensor([[3, 5, 7]]), max_new_tokens=60, draft_length=7)
    assert calls[:50] == [7] * 50 and all(a == 1 for a in full.acceptance_lengths[0])  # never right
    calls.clear()
    # a machine where a drafter pass costs half a target step (the tiny models' own timings are noise)
    policy = DraftLengthPolicy(VerifyCostTable(seconds=tuple(1.0 + 0.05 * q for q in range(8)), draft_s=0.5), 8)
    # (no context lookup: the output [0] * 60 is a loop it would copy; tests/core/test_context_lookup.py)
    auto = generate(model, drafter, torch.tensor([[3, 5, 7]]), max_new_tokens=60, draft_length=policy,
                    context_lookup=False)
    assert auto.tokens == full.tokens and auto.tokens[0] == target_greedy(model, [3, 5, 7], 60) == [0] * 60
    # after a few tries the policy stops drafting; only its exploration steps (2, 4, 8, ... apart) draft
    assert len(auto.acceptance_lengths[0]) == 59 and len(calls) <= 12, calls


@pytest.mark.parametrize("seed", range(6))
def test_the_target_alone_decodes_a_ragged_batch_like_hugging_face(seed):
    """The baseline (`generate_autoregressive`, all rows in one batch) is the target's own greedy decoding."""
    model, _, prompts, max_new, stop = _case(seed)
    ids, mask = _padded(prompts, left=seed % 2 == 1)
    result = generate_autoregressive(model, ids, attention_mask=mask, max_new_tokens=max_new, stop_token_ids=stop)
    for row, prompt in enumerate(prompts):
        assert result.tokens[row] == target_greedy(model, prompt, max_new, stop), f"row {row}"
