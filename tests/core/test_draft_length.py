"""Cost-aware draft length: k maximises expected committed tokens per second, and keeps learning."""

from __future__ import annotations

import pytest
import torch
import json

from dflash_core.tuning.cost_table import (COST_FILE, VerifyCostTable, cost_table_for, measure_cost_table, spot_times,
                                    table_is_stale)
from dflash_core.tuning.draft_length import AcceptanceHistory, DraftLengthPolicy
from dflash_core.tuning.plan import Tuning
from dflash_core.sampling.tokens import SamplingParams
from dflash_core.target.adapter import TargetModel
from tiny import drafter_config, tiny_drafter, tiny_target

# verify over 1..4 tokens; the 4-token forward is a step up (as at a kernel tile boundary)
STEPPED = (1.0, 1.2, 1.4, 2.4)


def _run(policy: DraftLengthPolicy, steps: int, accept) -> list[int]:
    """Decode `steps` steps where a row accepts `accept(k)` of the k drafts it verifies."""
    chosen = []
    for _ in range(steps):
        k = policy.choose()
        policy.observe(k, accept(k))
        chosen.append(k)
    return chosen


def test_drafter_that_never_accepts_ends_in_plain_steps():
    policy = DraftLengthPolicy(VerifyCostTable(seconds=(1.0, 1.1, 1.2, 1.3), draft_s=0.3))
    chosen = _run(policy, 30, accept=lambda k: 0)
    assert chosen[0] > 0  # the optimistic prior tries the drafter first
    assert chosen[3:5] == [0, 0]  # three rejected steps are enough
    # retries cost <= 5% of the plain steps' time: here 0.4-0.6 extra each, so one per 8-12 plain steps
    assert 1 <= sum(k > 0 for k in chosen[3:]) <= 3


def test_acceptance_history_pools_rows_and_shrinks_each_position_towards_the_one_before_hand_computed():
    history = AcceptanceHistory(3, memory=1.0)
    assert history.priors() is None  # no evidence: a policy keeps the Beta(2, 1) start
    for _ in range(3):
        history.record(2, 0)  # draft 1 verified and rejected
    history.record(0, 0)  # a plain step says nothing
    assert history.reached == [3.0, 0.0, 0.0] and history.accepted == [0.0, 0.0, 0.0]
    assert history.priors() == pytest.approx((1 / 3, 1 / 3, 1 / 3))  # (0 + 3 * 2/3) / (3 + 3), then no evidence
    history.record(3, 3)
    assert history.reached == [4.0, 1.0, 1.0] and history.accepted == [1.0, 1.0, 1.0]
    p1 = (1 + 2) / (4 + 3)
    p2 = (1 + 3 * p1) / (1 + 3)
    assert history.priors() == pytest.approx((p1, p2, (1 + 3 * p2) / 4))


@pytest.mark.parametrize("accept, first", [(lambda k: 0, 0), (lambda k: k, 3)])
def test_a_request_starts_from_what_earlier_requests_saw(accept, first):
    table = VerifyCostTable(seconds=(1.0, 1.1, 1.2, 1.3), draft_s=0.3)
    history = AcceptanceHistory(3)
    earlier = DraftLengthPolicy(table, history=history)
    for _ in range(10):
        earlier.observe(3, accept(3))
    assert DraftLengthPolicy(table).choose() == 3  # without a history: the optimistic start drafts
    assert DraftLengthPolicy(table, history=history).choose() == first  # never kept: plain steps from the start


def test_greedy_decoding_keeps_a_history_per_drafter_and_source_and_stays_lossless():
    from dflash_core.decode.loop import generate

    target, drafter = _tiny_pair()
    ids = torch.tensor([[3, 5, 7, 9, 11]])
    tuning = Tuning()
    plain = generate(target, drafter, ids, max_new_tokens=16, draft_length=0).tokens
    assert generate(target, drafter, ids, max_new_tokens=16, tuning=tuning).tokens == plain
    greedy = tuning.history(drafter)
    assert greedy.reached[0] > 0  # the drafter drafted, and what it got is kept for the next request
    assert generate(target, drafter, ids, max_new_tokens=16, tuning=tuning).tokens == plain  # the next starts from it
    assert tuning.history(drafter) is greedy and tuning.history(drafter, "lookup") is not greedy
    # a sampling request neither reads nor writes it: its seed must reproduce its sample whatever ran before
    seen = list(greedy.reached)
    sampled = [generate(target, drafter, ids, max_new_tokens=16, temperature=1.0, seed=5, tuning=tuning).tokens
               for _ in range(2)]
    assert sampled[0] == sampled[1] and greedy.reached == seen
    other = tiny_drafter(drafter_config(tiny_target(vocab=32, layers=2), block_size=4))
    assert tuning.history(other).reached == [0.0] * 3
    assert Tuning().history(drafter).reached == [0.0] * 3  # histories live in the Tuning, not the process


def test_drafter_that_always_accepts_uses_the_whole_block_on_a_flat_table():
    policy = DraftLengthPolicy(VerifyCostTable(seconds=(1.0,) * 8, draft_s=0.5))
    assert _run(policy, 10, accept=lambda k: k) == [7] * 10


@pytest.mark.parametrize("seconds, draft_s, expected", [
    # E(k) = 1, 1.8, 2.344, 2.75744 (p = 0.8, 0.68, 0.76, below)
    (STEPPED, 0.4, 2),  # T = 1.0, 1.6, 1.8, 2.8 -> E/T = 1.0, 1.125, 1.302, 0.985
    ((1.0, 1.2, 1.4, 1.5), 0.4, 3),  # T(3) = 1.9 -> E/T = 1.451, the best
    (STEPPED, 2.0, 0),  # T = 1.0, 3.2, 3.4, 4.4 -> E/T = 1.0, 0.563, 0.689, 0.627
])
def test_choose_maximises_tokens_per_second_hand_computed(seconds, draft_s, expected):
    policy = DraftLengthPolicy(VerifyCostTable(seconds=seconds, draft_s=draft_s), memory=1.0)
    policy.observe(3, 3)
    policy.observe(3, 1)
    # p1 = (2 + 2) / (2 + 3) (Beta(2, 1)); each next prior: 3 pseudo-counts at the previous estimate:
    # p2 = (1 + 3 * 0.8) / (2 + 3) (reached twice, accepted once), p3 = (1 + 3 * 0.68) / (1 + 3)
    assert policy.acceptance() == pytest.approx((0.8, 0.68, 0.76))
    assert policy.expected_tokens() == pytest.approx((1.0, 1.8, 2.344, 2.75744))
    assert policy.choose() == expected


@pytest.mark.parametrize("seconds, draft_s", [
    ((1.0, 1.1, 1.2, 1.3), 0.3),  # drafting cheap: a retry costs ~0.4 plain steps more
    ((1.0, 1.68, 2.03, 2.03), 0.69),  # the demo pair on an AVX2 CPU, 1 thread: ~1.4-1.7 more
    ((1.0, 1.0, 1.0, 1.0), 0.2),  # a GPU: the verify width is free (with a drafter pass of 0.05, k > 0 always pays)
])
def test_retries_cost_at_most_the_explore_share_and_notice_a_recovery(seconds, draft_s):
    costs = VerifyCostTable(seconds=seconds, draft_s=draft_s)
    policy = DraftLengthPolicy(costs)
    chosen = _run(policy, 400, accept=lambda k: 0)
    settled = chosen.index(0)
    steps = chosen[settled:]
    plain_s = steps.count(0) * costs.step(0)
    extra_s = sum(costs.step(k) - costs.step(0) for k in steps if k > 0)
    assert 0 < extra_s <= 0.05 * plain_s + max(costs.step(k) for k in range(4))  # the budget, + one retry
    retries = [i for i, k in enumerate(steps) if k > 0]
    gaps = [b - a for a, b in zip(retries, retries[1:])]
    # the dearer a retry on this machine, the longer the plain stretch before it (cheapest retry: k = 1)
    assert len(gaps) >= 2 and min(gaps) >= (costs.step(1) - costs.step(0)) / 0.05
    recovered = _run(policy, 400, accept=lambda k: k)
    first = next(i for i, k in enumerate(recovered) if k > 0)
    # a retry that pays is followed by another at once, so the drafter is back for good within a few steps
    assert all(k > 0 for k in recovered[first:]) and all(k == 3 for k in recovered[first + 4:])


def test_retry_gaps_follow_the_cost_of_a_retry_hand_computed():
    # block 2: k is 0 or 1; T(0) = 1, T(1) = 0.5 + 1.5 = 2: a retry costs 1 more, so it waits for
    # 1 / 0.05 = 20 s of plain steps: 20 plain steps, then the retry (the 21st step after settling)
    policy = DraftLengthPolicy(VerifyCostTable(seconds=(1.0, 1.5), draft_s=0.5))
    chosen = _run(policy, 90, accept=lambda k: 0)
    settled = chosen.index(0)
    retries = [i - settled for i, k in enumerate(chosen) if i >= settled and k > 0]
    assert retries[:3] == [20, 41, 62]


def test_trim_cuts_where_a_position_no_longer_pays_hand_computed():
    policy = DraftLengthPolicy(VerifyCostTable(seconds=STEPPED, draft_s=0.4))
    # E_j/T_j = 1/1.4, 1.9/1.6, 2.71/1.8, 2.791/2.8 -> j = 2
    assert policy.trim(3, [0.9, 0.9, 0.1]) == 2
    # 1/1.4 = 0.714 beats 1.1/1.6, 1.19/1.8, 1.271/2.8 -> verify no draft at all
    assert policy.trim(3, torch.tensor([0.1, 0.9, 0.9])) == 0
    assert policy.trim(1, [1.0]) == 1 and policy.trim(0, []) == 0
    with pytest.raises(ValueError, match="confidence per draft"):
        policy.trim(3, [0.9])


def test_cost_table_round_trip_bounds_and_batch_costing():
    table = VerifyCostTable(seconds=STEPPED, draft_s=0.4)
    assert VerifyCostTable.from_dict(table.to_dict()) == table
    assert table.relative() == pytest.approx((1.0, 1.2, 1.4, 2.4))
    assert table.verify(6) == pytest.approx(2.4 + 2 * (1.4 / 3))  # extended by the mean slope
    assert table.step(0) == 1.0 and table.step(1, rows=2) == pytest.approx(0.4 * table.verify(8) / 2.4 + 2.4)
    with pytest.raises(ValueError, match="positive time"):
        VerifyCostTable(seconds=(1.0, 0.0), draft_s=0.1)
    with pytest.raises(ValueError, match="not a verify cost table"):
        VerifyCostTable.from_dict({"seconds": [1.0]})
    with pytest.raises(ValueError, match="accepted <= verified"):
        DraftLengthPolicy(table).observe(2, 3)


def test_measure_cost_table_on_tiny_models():
    model = tiny_target(vocab=32, layers=2)
    drafter = tiny_drafter(drafter_config(model, block_size=4))
    table = measure_cost_table(model, drafter, 4, context=8, repeats=1)
    assert table.block_size == 4 and all(s > 0 for s in table.seconds)
    # how a drafting step splits into pass and read-out is timing-derived (noisy on a shared machine)
    assert table.draft_s >= 0 and table.head_s >= 0 and table.draft_s + table.head_s > 0
    assert list(table.seconds) == sorted(table.seconds)  # more tokens never cost less
    assert DraftLengthPolicy(table).choose() in range(4)


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9, top_k=5)])
def test_measure_cost_table_for_sampling_requests_on_tiny_models(sampling):
    model = tiny_target(vocab=32, layers=2)
    drafter = tiny_drafter(drafter_config(model, block_size=4))
    table = measure_cost_table(model, drafter, 4, context=8, repeats=1, sampling=sampling)  # draws, q, rejection test
    assert table.block_size == 4 and all(s > 0 for s in table.seconds) and list(table.seconds) == sorted(table.seconds)
    assert table.draft_s >= 0 and table.head_s >= 0 and table.draft_s + table.head_s > 0
    one, full = spot_times(model, drafter, 4, context=8, repeats=1, sampling=sampling)
    assert 0 < one and 0 < full


def test_table_is_stale_only_when_now_is_clearly_faster_hand_computed():
    table = VerifyCostTable(seconds=(1.0, 1.1, 1.2), draft_s=0.3)
    assert not table_is_stale(table, 1.0, 1.2) and not table_is_stale(table, 0.81, 0.97)  # within 1.25x
    assert table_is_stale(table, 0.79, 1.2) and table_is_stale(table, 1.0, 0.95)  # one width 1.26x faster
    assert not table_is_stale(table, 3.0, 3.0)  # slower now: a busy moment, the table measured at rest is kept
    assert not table_is_stale(table, 0.79, 0.95, tolerance=1.5)


def _tiny_pair():
    model = tiny_target(vocab=32, layers=2)
    drafter = tiny_drafter(drafter_config(model, block_size=4))
    return TargetModel(model, drafter.config.target_layer_ids), drafter


def _stored(cache_dir) -> tuple[str, VerifyCostTable]:
    (key, entry), = json.loads((cache_dir / COST_FILE).read_text()).items()
    return key, VerifyCostTable.from_dict(entry)


def _plant(cache_dir, key: str, table: VerifyCostTable) -> None:
    (cache_dir / COST_FILE).write_text(json.dumps({key: table.to_dict()}))


def _refuse(*_):
    raise AssertionError("no cached table: nothing to spot-check")


def test_cost_table_cache_is_kept_while_spot_times_agree(tmp_path, monkeypatch):
    target, drafter = _tiny_pair()
    measured = Tuning(tmp_path).cost_table(target, drafter, spot=_refuse)  # no cache: measured, written
    key, stored = _stored(tmp_path)
    assert stored == measured and measured.block_size == 4
    planted = VerifyCostTable(seconds=(1.0, 1.1, 1.2, 1.3), draft_s=0.5)  # no real forward takes a second
    _plant(tmp_path, key, planted)
    spots = []
    agree = lambda *args: spots.append(args[2]) or (0.9, 1.2)  # within 1.25x of the planted table
    tuning = Tuning(tmp_path)  # as a new process would
    assert tuning.cost_table(target, drafter, spot=agree) == planted
    assert spots == [4] and _stored(tmp_path)[1] == planted
    assert tuning.cost_table(target, drafter, spot=_refuse) == planted  # once per Tuning


def test_sampling_requests_are_costed_by_their_own_tables(tmp_path, monkeypatch):
    target, drafter = _tiny_pair()
    tuning = Tuning(tmp_path)
    greedy = tuning.cost_table(target, drafter, spot=_refuse)
    sampled = tuning.cost_table(target, drafter, SamplingParams(temperature=1.0), spot=_refuse)
    nucleus = tuning.cost_table(target, drafter, SamplingParams(temperature=1.0, top_p=0.9), spot=_refuse)
    keys = list(json.loads((tmp_path / COST_FILE).read_text()))
    assert len(keys) == 3 and "choice=" not in keys[0]  # greedy keeps the key tables had before
    assert keys[1] == keys[0] + "|choice=sample" and keys[2] == keys[0] + "|choice=sample+top_p"
    # the temperature's value costs nothing: T=0.5 is served T=1's table; T=0 is greedy
    assert tuning.cost_table(target, drafter, SamplingParams(temperature=0.5), spot=_refuse) is sampled
    assert tuning.cost_table(target, drafter, SamplingParams(), spot=_refuse) is greedy
    assert nucleus is not sampled
    # a cached sampled table is spot-checked the way it was measured: sampling too
    planted = VerifyCostTable(seconds=(1.0, 1.1, 1.2, 1.3), draft_s=0.5)
    _plant(tmp_path, keys[1], planted)
    spots = []
    agree = lambda *args, **kwargs: spots.append(kwargs) or (0.9, 1.2)
    assert Tuning(tmp_path).cost_table(target, drafter, SamplingParams(temperature=1.0), spot=agree) == planted
    assert spots == [{"sampling": SamplingParams(temperature=1.0)}]


def test_auto_draft_length_costs_a_sampling_request_by_the_sampled_table_and_stays_exact(tmp_path, monkeypatch):
    from dflash_core.decode.loop import generate

    target, drafter = _tiny_pair()
    tuning = Tuning(tmp_path)
    ids = torch.tensor([[3, 5, 7, 9, 11]])
    sampled = generate(target, drafter, ids, max_new_tokens=12, temperature=1.0, seed=4, tuning=tuning)
    assert [key.endswith("|choice=sample") for key in json.loads((tmp_path / COST_FILE).read_text())] == [True]
    assert len(sampled.tokens[0]) == 12  # the distribution's exactness: tests/core/test_sampling_lossless.py
    greedy = generate(target, drafter, ids, max_new_tokens=12, tuning=tuning)
    assert greedy.tokens == generate(target, drafter, ids, max_new_tokens=12, draft_length=0).tokens
    assert len(json.loads((tmp_path / COST_FILE).read_text())) == 2  # greedy: its own table


def test_cost_table_cache_measured_on_a_busy_machine_is_replaced(tmp_path, monkeypatch):
    target, drafter = _tiny_pair()
    cost_table_for(target, drafter, cache_dir=tmp_path)
    key, _ = _stored(tmp_path)
    busy = VerifyCostTable(seconds=(5.0, 5.5, 5.5, 5.5), draft_s=1.0)  # slow and flat: a loaded machine's
    _plant(tmp_path, key, busy)
    table = cost_table_for(target, drafter, cache_dir=tmp_path)  # real spot times: seconds faster
    assert table != busy and table.seconds[-1] < 1.0 and _stored(tmp_path)[1] == table


def test_cost_table_cached_at_rest_is_kept_while_the_machine_is_busy_now(tmp_path, monkeypatch):
    target, drafter = _tiny_pair()
    cost_table_for(target, drafter, cache_dir=tmp_path)
    key, _ = _stored(tmp_path)
    rested = VerifyCostTable(seconds=(1e-9, 2e-9, 3e-9, 4e-9), draft_s=1e-9)  # faster than any real forward
    _plant(tmp_path, key, rested)
    assert cost_table_for(target, drafter, cache_dir=tmp_path) == rested  # real spot times: slower, kept
    assert _stored(tmp_path)[1] == rested
    one, full = spot_times(target, drafter, 4, context=8, repeats=1)
    assert 0 < one and 0 < full


@pytest.mark.parametrize("rows_accepting, again", [(1, False), (8, True), (16, True)])
def test_a_retry_is_repeated_at_once_only_if_its_rows_accepted_half_their_drafts(rows_accepting, again):
    policy = DraftLengthPolicy(VerifyCostTable(seconds=(1.0, 1.68, 2.03, 2.03), draft_s=0.69))
    for _ in range(400):  # a drafter that is never right: settled on k = 0, retrying out of the budget
        k = policy.choose(16)
        for _ in range(16):
            policy.observe(k, 0)
    while (k := policy.choose(16)) == 0:  # the next retry
        for _ in range(16):
            policy.observe(0, 0)
    for row in range(16):  # k drafts verified per row; only some rows get them all accepted
        policy.observe(k, k if row < rows_accepting else 0)
    assert (policy.choose(16) > 0) is again


def test_generate_without_a_tuning_writes_nothing_and_keeps_nothing(tmp_path, monkeypatch):
    """A library call has no side effects: no cache file (wherever the cache directory points), no state left."""
    from dflash_core.decode.loop import generate

    target, drafter = _tiny_pair()
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(cache))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    ids = torch.tensor([[3, 5, 7, 9, 11], [2, 4, 6, 8, 10]])
    plain = generate(target, drafter, ids, max_new_tokens=12, draft_length=0).tokens
    for temperature in (0.0, 1.0):
        out = generate(target, drafter, ids, max_new_tokens=12, temperature=temperature, seed=3)
        assert len(out.tokens[0]) == 12
    assert generate(target, drafter, ids, max_new_tokens=12).tokens == plain
    assert list(cache.iterdir()) == [] and not (tmp_path / "xdg").exists()
    # the same calls with a cached Tuning do write there: the check above could see a file
    generate(target, drafter, ids, max_new_tokens=12, tuning=Tuning.cached())
    assert [p.name for p in cache.iterdir()] == [COST_FILE]
