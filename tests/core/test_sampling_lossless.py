"""Sampling keeps the target's distribution: a chi-square test that can (and is shown to) fail.

On a 4-token vocabulary the exact joint distribution of the first three generated tokens is
enumerated from the target with Hugging Face's own warpers; 3,000 speculative samples are compared
with it, and with 3,000 samples of `model.generate(do_sample=True)`.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from dflash_core import GenerationError, generate
from dflash_core.tuning.plan import Tuning
from tiny import drafter_config, tiny_drafter, tiny_target
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

PROMPT = [1, 2, 3]
STEPS = 3
SAMPLES = 3000
ALPHA = 1e-3  # false-alarm rate of each test


def _warp(logits, temperature, top_k, top_p):
    scores = TemperatureLogitsWarper(temperature)(None, logits)
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return scores


@torch.no_grad()
def exact_joint(model, temperature, top_k, top_p, prompt=PROMPT, steps=STEPS) -> dict[tuple[int, ...], float]:
    vocab = model.config.vocab_size
    probs = {(): 1.0}
    for _ in range(steps):
        prefixes = list(probs)
        ids = torch.tensor([prompt + list(p) for p in prefixes])
        logits = model(ids).logits[:, -1].double()
        step = _warp(logits, temperature, top_k, top_p).softmax(-1)
        probs = {p + (t,): probs[p] * step[i, t].item() for i, p in enumerate(prefixes) for t in range(vocab)}
    return probs


def chi_square_p(counts: Counter, expected: dict, total: int) -> float:
    """Goodness of fit; cells expected < 5 times are pooled. Returns the p-value."""
    big = [c for c, p in expected.items() if p * total >= 5]
    observed = [counts[c] for c in big] + [total - sum(counts[c] for c in big)]
    wanted = [expected[c] * total for c in big] + [total * (1 - sum(expected[c] for c in big))]
    if wanted[-1] < 1e-9:
        observed, wanted = observed[:-1], wanted[:-1]
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, wanted))
    df = len(wanted) - 1
    return torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                   torch.tensor(stat / 2, dtype=torch.float64)).item()


def homogeneity_p(a: Counter, b: Counter) -> float:
    """Two-sample chi-square test that a and b come from one distribution."""
    total_a, total_b = sum(a.values()), sum(b.values())
    pooled = {c: (a[c] + b[c]) / (total_a + total_b) for c in set(a) | set(b)}
    cells = [c for c, p in pooled.items() if p * min(total_a, total_b) >= 5]
    rest = lambda n, cnt: n - sum(cnt[c] for c in cells)
    stat = 0.0
    for obs_a, obs_b, p in [(a[c], b[c], pooled[c]) for c in cells] + \
            [(rest(total_a, a), rest(total_b, b), 1 - sum(pooled[c] for c in cells))]:
        if p <= 1e-12:
            continue
        stat += (obs_a - p * total_a) ** 2 / (p * total_a) + (obs_b - p * total_b) ** 2 / (p * total_b)
    df = len(cells)
    return torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                   torch.tensor(stat / 2, dtype=torch.float64)).item()


@pytest.fixture(scope="module")
def pair():
    model = tiny_target(vocab=4, layers=3, seed=21)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.3)  # softer distribution: every sequence is plausible
    drafter = tiny_drafter(drafter_config(model, block_size=4), seed=5)
    return model, drafter


def speculative_samples(model, drafter, temperature, top_k, top_p, seed=0, draft_length=None):
    ids = torch.tensor([PROMPT] * SAMPLES)
    k = drafter.config.block_size - 1 if draft_length is None else draft_length
    result = generate(model, drafter, ids, max_new_tokens=STEPS, temperature=temperature, top_k=top_k,
                      top_p=top_p, seed=seed, draft_length=k)
    return Counter(tuple(t) for t in result.tokens), result


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.8, 3, 0.9), (1.3, 0, 0.8)])
def test_speculative_sampling_matches_target_distribution(pair, temperature, top_k, top_p):
    model, drafter = pair
    expected = exact_joint(model, temperature, top_k, top_p)
    counts, result = speculative_samples(model, drafter, temperature, top_k, top_p)
    assert result.tau > 1.05, "drafts must really be accepted for this test to mean anything"
    assert chi_square_p(counts, expected, SAMPLES) > ALPHA
    torch.manual_seed(1)
    hf = model.generate(torch.tensor([PROMPT] * SAMPLES), do_sample=True, temperature=temperature,
                        top_k=top_k, top_p=top_p, max_new_tokens=STEPS, min_new_tokens=STEPS, pad_token_id=0)
    hf_counts = Counter(tuple(t) for t in hf[:, len(PROMPT):].tolist())
    assert chi_square_p(hf_counts, expected, SAMPLES) > ALPHA  # the exact distribution is right
    assert homogeneity_p(counts, hf_counts) > ALPHA


def test_context_lookup_copies_keep_the_target_distribution(pair):
    """Copies from a repetitive prompt are drafts like any other: the samples still follow the target."""
    from dflash_core import DecodeProfile
    from dflash_core.tuning.cost_table import VerifyCostTable
    from dflash_core.tuning.draft_length import DraftLengthPolicy

    model, drafter = pair
    prompt = [1, 2, 1, 2, 1, 2, 1]  # a lookup copy ([2, 1, 2]) from the first step on
    expected = exact_joint(model, 1.0, 0, 1.0, prompt)
    # flat verify times (a GPU-like machine): 3,000 rows may verify blocks for free, so copies pay
    policy = DraftLengthPolicy(VerifyCostTable(seconds=(1.0, 1.0, 1.0, 1.0), draft_s=0.5), 4)
    profile = DecodeProfile()
    result = generate(model, drafter, torch.tensor([prompt] * SAMPLES), max_new_tokens=STEPS, temperature=1.0,
                      seed=3, draft_length=policy, profile=profile)
    assert profile.lookup_steps >= 1 and result.tau > 1.05, "copies must really be drafted and accepted"
    assert chi_square_p(Counter(tuple(t) for t in result.tokens), expected, SAMPLES) > ALPHA


def test_the_test_can_fail(pair):
    """A sampler with the wrong distribution (temperature 0.4 instead of 1.0) is rejected by both tests."""
    model, drafter = pair
    expected = exact_joint(model, 1.0, 0, 1.0)
    wrong, _ = speculative_samples(model, drafter, 0.4, 0, 1.0)
    right, _ = speculative_samples(model, drafter, 1.0, 0, 1.0, seed=9)
    assert chi_square_p(wrong, expected, SAMPLES) < ALPHA
    assert homogeneity_p(wrong, right) < ALPHA
    # and a drafter-only sampler (accept every draft) is not the target's distribution either
    greedy_draft = Counter({tuple(generate(model, drafter, torch.tensor([PROMPT]), max_new_tokens=STEPS).tokens[0]): SAMPLES})
    assert chi_square_p(greedy_draft, expected, SAMPLES) < ALPHA


def test_seed_reproduces_and_varies(pair):
    model, drafter = pair
    ids = torch.tensor([PROMPT] * 8)
    tuning = Tuning()  # one cost table: "auto" draft lengths follow it, and they decide which draws a seed feeds
    a = generate(model, drafter, ids, max_new_tokens=20, temperature=1.0, seed=3, tuning=tuning).tokens
    b = generate(model, drafter, ids, max_new_tokens=20, temperature=1.0, seed=3, tuning=tuning).tokens
    c = generate(model, drafter, ids, max_new_tokens=20, temperature=1.0, seed=4, tuning=tuning).tokens
    assert a == b and a != c


@pytest.mark.parametrize("kwargs,pattern", [
    (dict(temperature=-0.1), r"temperature is -0.1, expected a finite number >= 0"),
    (dict(top_p=0.0), r"top_p is 0.0, expected a value in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p is 1.5"),
    (dict(top_k=-1), r"top_k is -1, expected an integer >= 0"),
    (dict(max_new_tokens=0), r"max_new_tokens is 0, expected an integer >= 1"),
    (dict(max_new_tokens=600), r"prompt \(3 tokens\) plus max_new_tokens \(600\) is 603, beyond the target's 512"),
])
def test_bad_requests(pair, kwargs, pattern):
    model, drafter = pair
    args = {"max_new_tokens": 4, **kwargs}
    with pytest.raises(GenerationError, match=pattern) as info:
        generate(model, drafter, torch.tensor([PROMPT]), **args)
    assert "\n" not in str(info.value)


def test_empty_prompt(pair):
    model, drafter = pair
    with pytest.raises(GenerationError, match="prompt is empty"):
        generate(model, drafter, torch.zeros(1, 0, dtype=torch.long), max_new_tokens=4)
    with pytest.raises(GenerationError, match="row 1 is empty after removing padding"):
        generate(model, drafter, torch.tensor([[1, 2], [0, 0]]), attention_mask=torch.tensor([[1, 1], [0, 0]]),
                 max_new_tokens=4)


# ---- sampled drafts: d ~ q, kept with probability min(1, p/q), residual on rejection ------------------

def _one_position(p, q, claimed_q=None, rows=20000, seed=0):
    """Draw d ~ q per row and run the acceptance test with `claimed_q` (default q) as the proposal."""
    from dflash_core.sampling.speculative import speculative_accept

    gen = torch.Generator().manual_seed(seed)
    drafts = torch.multinomial(q.expand(rows, -1), 1, replacement=True, generator=gen)  # [rows, 1]
    claimed = (q if claimed_q is None else claimed_q).expand(rows, 1, -1)
    target = torch.stack([p, torch.full_like(p, 1 / len(p))]).expand(rows, -1, -1)  # p_0, then any p_1
    accepted, nxt = speculative_accept(drafts, claimed, target, gen)
    first = torch.where(accepted == 1, drafts[:, 0], nxt)  # the first committed token
    return Counter(first.tolist()), accepted.float().mean().item()


@pytest.mark.parametrize("q", [
    [0.1, 0.3, 0.2, 0.2, 0.2],  # puts mass where p has none; a greedy draft of its argmax (1) is kept w.p. 0.2
    [0.0, 0.5, 0.5, 0.0, 0.0],  # none where p has most (a q cut to a read-out list): the residual writes it
])
def test_speculative_accept_commits_the_target_distribution_and_accepts_sum_min(q):
    p = torch.tensor([0.5, 0.2, 0.2, 0.1, 0.0])
    q = torch.tensor(q)
    counts, rate = _one_position(p, q)
    assert chi_square_p(counts, {t: p[t].item() for t in range(5)}, 20000) > ALPHA
    assert counts[4] == 0  # a token the target never writes is never committed
    expected_rate = torch.minimum(p, q).sum().item()
    assert abs(rate - expected_rate) < 4 * (expected_rate * (1 - expected_rate) / 20000) ** 0.5


def test_speculative_accept_fails_with_the_wrong_proposal():
    """Negative control: dividing by a q the drafts were not drawn from skews the output, and the test sees it."""
    p = torch.tensor([0.5, 0.2, 0.2, 0.1, 0.0])
    q = torch.tensor([0.1, 0.3, 0.2, 0.2, 0.2])
    counts, _ = _one_position(p, q, claimed_q=torch.full((5,), 0.2))
    assert chi_square_p(counts, {t: p[t].item() for t in range(5)}, 20000) < ALPHA


def test_speculative_accept_keeps_every_draft_when_q_equals_p():
    from dflash_core.sampling.speculative import speculative_accept

    gen = torch.Generator().manual_seed(1)
    p = torch.rand(64, 5, 7, generator=gen).softmax(-1)  # [B, k+1, V]
    drafts = torch.multinomial(p[:, :4].reshape(-1, 7), 1, generator=gen).view(64, 4)
    accepted, nxt = speculative_accept(drafts, p[:, :4], p, gen)
    assert accepted.tolist() == [4] * 64 and nxt.shape == (64,)


def test_draft_sampler_draws_from_the_warped_head_and_keeps_q():
    from dflash_core.sampling.speculative import DraftSampler
    from dflash_core.sampling.tokens import SamplingParams, warp_logits

    head = torch.nn.Linear(6, 10, bias=False)
    params = SamplingParams(temperature=0.7, top_k=3)
    sampler = DraftSampler(head, params, torch.Generator().manual_seed(0))
    hidden = torch.randn(2, 3, 6)
    tokens = sampler(hidden)
    probs = sampler.take()
    assert probs.shape == (2, 3, 10) and torch.allclose(probs, warp_logits(head(hidden), params).softmax(-1))
    assert (probs.gather(2, tokens[..., None]) > 0).all()  # every draft lies in its top-3
    assert sampler.take() is None  # once


def test_sampling_drafts_over_the_whole_vocabulary_despite_a_read_out_list(pair):
    """At T > 0 a drafter's read-out list (greedy tokens) does not cut q: drafts outside it are proposed,
    and the samples follow the target."""
    model, drafter = pair
    proposed = []
    original = drafter.propose
    drafter.propose = lambda *args: proposed.append(original(*args)) or proposed[-1]
    drafter.draft_vocab = [0, 2]
    try:
        counts, result = speculative_samples(model, drafter, 1.0, 0, 1.0, seed=11)
    finally:
        drafter.draft_vocab = None
        del drafter.propose
    assert result.tau > 1.05, "drafts must really be accepted for this test to mean anything"
    assert chi_square_p(counts, exact_joint(model, 1.0, 0, 1.0), SAMPLES) > ALPHA
    assert set(torch.cat([p.flatten() for p in proposed]).tolist()) - {0, 2}, "q must reach beyond the list"
    drafter.draft_vocab = [0, 2]  # greedy requests still read out over the list
    try:
        proposed.clear()
        drafter.propose = lambda *args: proposed.append(original(*args)) or proposed[-1]
        generate(model, drafter, torch.tensor([PROMPT]), max_new_tokens=8, draft_length=3)
    finally:
        drafter.draft_vocab = None
        del drafter.propose
    assert proposed and set(torch.cat([p.flatten() for p in proposed]).tolist()) <= {0, 2}


def test_a_drafter_trained_over_its_list_samples_drafts_from_the_list_and_keeps_the_target_distribution(pair):
    """`sample_over_list` (`dflash train --loss-vocab list`): q is cut to the list, so every draft comes from it,
    and the committed samples still follow the target (tokens outside the list come from the residual)."""
    model, drafter = pair
    proposed = []
    original = drafter.propose
    drafter.propose = lambda *args: proposed.append(original(*args)) or proposed[-1]
    drafter.draft_vocab, drafter.sample_over_list = [0, 2], True
    try:
        counts, result = speculative_samples(model, drafter, 1.0, 0, 1.0, seed=12)
    finally:
        drafter.draft_vocab, drafter.sample_over_list = None, False
        del drafter.propose
    assert result.tau > 1.05, "drafts must really be accepted for this test to mean anything"
    assert proposed and set(torch.cat([p.flatten() for p in proposed]).tolist()) <= {0, 2}
    assert chi_square_p(counts, exact_joint(model, 1.0, 0, 1.0), SAMPLES) > ALPHA
    assert {t for seq in counts for t in seq} - {0, 2}, "the samples must reach beyond the list"
