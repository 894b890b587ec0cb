"""Drafts trimmed by the drafter's own confidence: the read-out, the trim rule, the evidence it leaves, losslessness."""

from __future__ import annotations

import random

import pytest
import torch
from dflash_core import generate, generate_autoregressive
from dflash_core.decode.draft_confidence import ConfidentReadOut, confident_read_out
from dflash_core.tuning.cost_table import VerifyCostTable
from dflash_core.tuning.draft_length import AcceptanceHistory, DraftLengthPolicy
from dflash_core.model.draft_vocab import read_out_for
from dflash_core.decode.profiling import DecodeProfile
from dflash_core.target.adapter import TargetModel
from tiny import ARCHS, drafter_config, tiny_drafter, tiny_target

STEPPED = (1.0, 1.2, 1.4, 2.4)


@pytest.mark.parametrize("draft_vocab", [None, [1, 3, 5, 7, 11, 40]])
def test_read_out_drafts_as_the_plain_one_and_keeps_the_argmax_probability(draft_vocab):
    target = TargetModel(tiny_target(vocab=64, seed=1))
    drafter = tiny_drafter(drafter_config(target.model), seed=2)
    drafter.draft_vocab = draft_vocab
    hidden = torch.randn(2, 3, target.hidden_size, generator=torch.Generator().manual_seed(0))
    read_out = confident_read_out(drafter, target)
    assert read_out.take() is None  # nothing read out yet
    drafts = read_out(hidden)
    assert torch.equal(drafts, read_out_for(drafter, target)(hidden))
    logits = target.logits(hidden)
    if draft_vocab is not None:
        logits = logits[..., draft_vocab]
    expected = logits.softmax(dim=-1).amax(dim=-1)  # [2, 3]
    assert torch.allclose(read_out.take(), expected, atol=1e-6)
    assert read_out.take() is None  # taken once


def test_confidence_of_a_hand_made_head_hand_computed():
    read_out = ConfidentReadOut(lambda hidden: hidden, ids=torch.tensor([7, 9]))  # logits = hidden, columns -> ids
    drafts = read_out(torch.tensor([[[0.0, 0.0], [2.0, 0.0]]]))
    assert drafts.tolist() == [[7, 7]]  # ties: the first column, as greedy decoding
    e = torch.exp(torch.tensor(-2.0)).item()
    assert read_out.take()[0].tolist() == pytest.approx([0.5, 1 / (1 + e)])


def test_trim_over_rows_sums_their_expected_tokens_hand_computed():
    policy = DraftLengthPolicy(VerifyCostTable(seconds=STEPPED, draft_s=0.4))
    # 2 rows: T_j = 0.4 scaled by verify(8)/verify(4) = (2.4 + 4 * 1/3) / 2.4 + verify(2 (j + 1)), the table
    # extended by its slope 1.4/3 past 4 tokens; E_j = 2 + survivals summed over rows
    rows = torch.tensor([[0.99, 0.99, 0.2], [0.95, 0.9, 0.1]])
    slope = 1.4 / 3
    sunk = 0.4 * (2.4 + 4 * slope) / 2.4
    times = [sunk + t for t in (1.2, 2.4, 2.4 + 2 * slope, 2.4 + 4 * slope)]
    survive = [0.99 + 0.95, 0.99 * 0.99 + 0.95 * 0.9, 0.99 * 0.99 * 0.2 + 0.95 * 0.9 * 0.1]
    expected = [2, 2 + survive[0], 2 + sum(survive[:2]), 2 + sum(survive)]
    rates = [e / t for e, t in zip(expected, times)]  # 1.05, 1.27, 1.43, 1.22
    assert policy.trim(3, rows) == max(range(4), key=lambda j: (rates[j], -j)) == 2
    assert policy.trim(3, rows[:1]) == policy.trim(3, [0.9, 0.9, 0.9])  # one row: the same as a flat list
    with pytest.raises(ValueError, match="confidence per draft"):
        policy.trim(3, rows[:, :2])


def test_a_trimmed_draft_counts_as_reached_with_its_confidence_as_acceptance():
    history = AcceptanceHistory(3, memory=1.0)
    policy = DraftLengthPolicy(VerifyCostTable(seconds=STEPPED, draft_s=0.4), memory=1.0, history=history)
    policy.observe(1, 1, next_confidence=0.25)  # draft 1 verified and kept; draft 2 trimmed at 0.25
    assert policy.reached == [1.0, 1.0, 0.0] and policy.accepted == [1.0, 0.25, 0.0]
    policy.observe(2, 0, next_confidence=0.5)  # rejected at draft 1: draft 3 was never reached
    assert policy.reached == [2.0, 1.0, 0.0] and policy.accepted == [1.0, 0.25, 0.0]
    weight = policy.prior_weight
    policy.observe(0, 0, next_confidence=0.1)  # all trimmed: a drafting step (ages by memory, not idly)
    assert policy.reached == [3.0, 1.0, 0.0] and policy.accepted == [1.1, 0.25, 0.0]
    assert policy.prior_weight == weight  # memory 1.0; a plain step would have aged it by IDLE_MEMORY
    assert history.reached == [3.0, 1.0, 0.0] and history.accepted == pytest.approx([1.1, 0.25, 0.0])
    with pytest.raises(ValueError, match="next_confidence"):
        policy.observe(1, 0, next_confidence=1.5)
    with pytest.raises(ValueError, match="next_confidence"):
        policy.observe(3, 3, next_confidence=0.5)  # nothing lies past the whole block


def test_a_never_right_but_unsure_drafter_is_not_drafted_for_long():
    """Trimmed steps are evidence: a drafter whose drafts are all trimmed (low confidence) teaches the
    policy to stop drafting, as rejections would, instead of paying a drafter pass every step."""
    policy = DraftLengthPolicy(VerifyCostTable(seconds=(1.0, 1.1, 1.2, 1.3), draft_s=0.3))
    chosen = []
    for _ in range(30):
        k = policy.choose()
        chosen.append(k)
        if k:
            kept = policy.trim(k, [0.05] * k)
            assert kept == 0
            policy.observe(0, 0, next_confidence=0.05)
        else:
            policy.observe(0, 0)
    assert chosen[5:10] == [0] * 5


def _case(seed: int):
    rng = random.Random(seed)
    vocab = rng.choice([6, 12, 64])
    model = tiny_target(rng.choice(sorted(ARCHS)), vocab=vocab, layers=3, hidden=32, seed=seed)
    block = rng.choice([4, 8, 16])
    cfg = drafter_config(model, block_size=block, layer_ids=(rng.randrange(3),))
    drafter = tiny_drafter(cfg, seed=seed, std=rng.choice([0.05, 0.3]))
    prompts = [[rng.randrange(vocab - 1) for _ in range(rng.randint(1, 12))] for _ in range(rng.choice([1, 2, 3]))]
    # verify costs rising gently: confident drafts pay, doubtful ones are trimmed
    costs = VerifyCostTable(seconds=tuple(1.0 + 0.05 * q for q in range(block)), draft_s=0.2)
    return model, drafter, prompts, rng.randint(8, 40), costs


@pytest.mark.parametrize("seed", range(16))
def test_trimmed_decoding_matches_the_target_alone(seed):
    model, drafter, prompts, max_new, costs = _case(seed)
    width = max(len(p) for p in prompts)
    ids = torch.tensor([p + [0] * (width - len(p)) for p in prompts])
    mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in prompts])
    profile = DecodeProfile()
    policy = DraftLengthPolicy(costs, drafter.config.block_size)
    result = generate(model, drafter, ids, attention_mask=mask, max_new_tokens=max_new, draft_length=policy,
                      context_lookup=seed % 2 == 0, confidence_trim=True, profile=profile)
    for row, prompt in enumerate(prompts):
        alone = generate_autoregressive(model, torch.tensor([prompt]), max_new_tokens=max_new).tokens[0]
        assert result.tokens[row] == alone, f"row {row}"
    assert profile.trimmed_steps <= profile.steps


def test_the_sweep_really_trims_and_still_accepts_drafts():
    """The test above is not vacuous: steps are trimmed, and trimmed decoding still commits several tokens a step."""
    trimmed = longest = 0
    for seed in range(16):
        model, drafter, prompts, max_new, costs = _case(seed)
        profile = DecodeProfile()
        result = generate(model, drafter, torch.tensor([prompts[0]]), max_new_tokens=max_new,
                          draft_length=DraftLengthPolicy(costs, drafter.config.block_size), context_lookup=False,
                          confidence_trim=True, profile=profile)
        trimmed += profile.trimmed_steps
        longest = max([longest] + result.acceptance_lengths[0])
    assert trimmed >= 10 and longest >= 3


def test_trimming_is_opt_in_and_never_for_fixed_draft_lengths():
    model, drafter, prompts, max_new, costs = _case(3)
    ids = torch.tensor([prompts[0]])
    for kwargs in ({"draft_length": DraftLengthPolicy(costs, drafter.config.block_size)},  # the default: off
                   {"draft_length": drafter.config.block_size - 1, "confidence_trim": True}):
        profile = DecodeProfile()
        generate(model, drafter, ids, max_new_tokens=max_new, context_lookup=False, profile=profile, **kwargs)
        assert profile.trimmed_steps == 0


def test_sampling_requests_are_never_trimmed():
    """A sampled draft's length must not depend on the drawn tokens: confidence_trim leaves sampling alone."""
    model, drafter, prompts, max_new, costs = _case(5)
    profile = DecodeProfile()
    generate(model, drafter, torch.tensor([prompts[0]]), max_new_tokens=max_new, temperature=1.0, seed=0,
             draft_length=DraftLengthPolicy(costs, drafter.config.block_size), confidence_trim=True, profile=profile)
    assert profile.steps > 0 and profile.trimmed_steps == 0
