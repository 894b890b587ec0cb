"""Token trees (`decode.tree`, `decode.tree_verify`): lossless greedy and sampled, the tree mask and the
cache after acceptance against brute force, the growth and size rules."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from dflash_core import GenerationError, generate
from dflash_core.decode.sources import Proposal, StepInput
from dflash_core.decode.tree import DraftTree, TreeSource, grow_tree
from dflash_core.decode.tree_verify import TreeVerifier, ancestor_matrix
from dflash_core.sampling.multi_candidate import draw_without_replacement, recursive_accept
from dflash_core.sampling.tokens import SamplingParams
from dflash_core.target.adapter import TargetModel
from dflash_core.target.cache import TargetCache
from dflash_core.tuning.cost_table import VerifyCostTable
from dflash_core.tuning.tree_calibration import Calibration
from test_greedy_lossless import _padded, target_greedy
from test_sampling_lossless import ALPHA, PROMPT, SAMPLES, chi_square_p, exact_joint
from tiny import ARCHS, drafter_config, tiny_drafter, tiny_target
from transformers import DynamicCache


def _random_tree(rng: random.Random, nodes: int, depth_limit: int) -> DraftTree:
    """Any tree: node i's parent drawn among the nodes before it (depth within the limit)."""
    tree = DraftTree()
    for node in range(1, nodes + 1):
        choices = [p for p in range(node) if (0 if p == 0 else tree.depths[p - 1]) < depth_limit]
        parent = rng.choice(choices)
        tree.parents.append(parent)
        tree.depths.append(1 + (0 if parent == 0 else tree.depths[parent - 1]))
        tree.ranks.append(sum(1 for p in tree.parents[:-1] if p == parent))
        tree.probs.append(0.5)
        tree.scores.append(0.5)
        tree.off_chain.append(False)
    return tree


# ---- greedy: the target's own output ----------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(24))
def test_greedy_tree_decoding_matches_the_target(seed):
    rng = random.Random(seed)
    arch = sorted(ARCHS)[seed % len(ARCHS)]
    vocab = rng.choice([4, 6, 64])
    model = tiny_target(arch, vocab=vocab, layers=rng.choice([2, 3]), seed=seed)
    drafter = tiny_drafter(drafter_config(model, block_size=rng.choice([2, 4, 7])), seed=seed)
    prompts = [[rng.randrange(vocab - 1) for _ in range(rng.randint(1, 12))] for _ in range(rng.choice([1, 2, 3]))]
    ids, mask = _padded(prompts, left=seed % 2 == 0)
    tree = ["auto", 1, 3, 9, 30][seed % 5]
    draft_length = "auto" if tree == "auto" else drafter.config.block_size - 1
    stop = [rng.randrange(vocab)] if seed % 3 == 0 else None
    max_new = rng.randint(1, 30)
    result = generate(model, drafter, ids, attention_mask=mask, max_new_tokens=max_new, stop_token_ids=stop,
                      tree=tree, draft_length=draft_length)
    for row, prompt in enumerate(prompts):
        assert result.tokens[row] == target_greedy(model, prompt, max_new, stop), f"row {row}"
        assert sum(result.acceptance_lengths[row]) + 1 == len(result.tokens[row])


def test_greedy_trees_accept_more_than_the_chain_at_equal_drafter():
    """On a 6-token vocabulary the drafter's top candidates cover the target's choice often: the tree keeps
    more tokens per step than the chain, and several per step (the test above is not vacuous)."""
    model = tiny_target("qwen3", vocab=6, layers=2, seed=3)
    drafter = tiny_drafter(drafter_config(model, block_size=6), seed=4)
    ids = torch.tensor([[1, 2, 3, 4], [2, 2, 0, 1], [4, 3, 2, 1]])
    chain = generate(model, drafter, ids, max_new_tokens=40, draft_length=5, context_lookup=False)
    tree = generate(model, drafter, ids, max_new_tokens=40, draft_length=5, context_lookup=False, tree=24)
    assert tree.tokens == chain.tokens
    assert tree.tau > 1.3 * chain.tau and max(max(a) for a in tree.acceptance_lengths) >= 4


# ---- the tree pass against brute force ---------------------------------------------------------------------
def _context(model, rows: list[list[int]]) -> tuple[TargetModel, TargetCache]:
    """A TargetCache holding `rows` (different lengths: a ragged cache), as the decoder's prefill leaves it."""
    target = TargetModel(model)
    lengths = [len(r) for r in rows]
    width = max(lengths)
    ids = torch.tensor([r + [r[-1]] * (width - len(r)) for r in rows])
    positions = torch.arange(width).expand(len(rows), -1)
    valid = positions < torch.tensor(lengths)[:, None]
    cache = TargetCache(len(rows))
    target(ids, positions, cache.cache, cache.attention_mask(target, positions, valid))
    cache.commit(width, lengths)
    return target, cache


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_tree_logits_and_cache_equal_feeding_each_path_alone(arch):
    """Every node's logits are the target's after the context and that node's path alone; after the verdict,
    each row's cache equals one built by feeding the context and the accepted path alone."""
    rng = random.Random(7)
    model = tiny_target(arch, vocab=8, layers=3, seed=11)
    rows = [[rng.randrange(8) for _ in range(n)] for n in (5, 9)]
    target, cache = _context(model, rows)
    trees = [_random_tree(rng, 7, 4), _random_tree(rng, 7, 4)]
    drafts = torch.tensor([[rng.randrange(8) for _ in range(7)] for _ in trees])
    last = torch.tensor([3, 5])
    positions = torch.tensor(cache.lengths)[:, None] + torch.arange(5)
    step = StepInput(last, positions, 4)
    verifier = TreeVerifier(SamplingParams(), None)
    # the tree pass itself, as the verifier runs it
    depths = torch.tensor([[0] + t.depths for t in trees])
    among = torch.stack([ancestor_matrix(t, 8) for t in trees])
    probe = TargetCache(2)
    probe.cache, probe.lengths, probe.slots = _copy(cache.cache), list(cache.lengths), cache.slots
    out = target(torch.cat([last[:, None], drafts], 1), positions[:, :1] + depths, probe.cache,
                 probe.attention_mask(target, positions[:, :1] + depths, among_queries=among))
    logits = target.logits(out.hidden)
    for b, (row, tree) in enumerate(zip(rows, trees)):
        for node in range(8):
            path, walk = [], node
            while walk:
                path.append(int(drafts[b, walk - 1]))
                walk = tree.parents[walk - 1]
            alone = model(torch.tensor([row + [int(last[b])] + path[::-1]])).logits[0, -1]
            torch.testing.assert_close(logits[b, node], alone, atol=1e-4, rtol=1e-4)
    # the verdict and the cache it leaves: plant the target's own choices so that a deep path is accepted
    for b, tree in enumerate(trees):
        node = max(range(1, 8), key=lambda n: tree.depths[n - 1])
        while node:
            parent = tree.parents[node - 1]
            drafts[b, node - 1] = int(logits[b, parent].argmax())
            node = parent
    for b, tree in enumerate(trees):  # siblings must differ (a tree's children are distinct tokens)
        for parent, kids in tree.children().items():
            seen = set()
            for kid in kids:
                while int(drafts[b, kid - 1]) in seen:
                    drafts[b, kid - 1] = (int(drafts[b, kid - 1]) + 1) % 8
                seen.add(int(drafts[b, kid - 1]))
    verdict = verifier.verify(target, cache, step, Proposal("drafter", drafts, trees=trees))
    cache.commit(8, verdict.counts, verdict.kept)
    assert max(verdict.accepted) >= 2, "a deep path must be accepted for this check to mean anything"
    for b, row in enumerate(rows):
        path = [int(drafts[b, n - 1]) for n in verdict.kept[b][1:]]
        assert verdict.committed[b][:-1] == path
        fresh = DynamicCache()
        model(torch.tensor([row + [int(last[b])] + path]), past_key_values=fresh, use_cache=True)
        length = len(row) + 1 + len(path)
        assert cache.lengths[b] == length
        for kept, alone in zip(cache.cache.layers, fresh.layers):
            torch.testing.assert_close(kept.keys[b, :, :length], alone.keys[0], atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(kept.values[b, :, :length], alone.values[0], atol=1e-5, rtol=1e-4)
        # the drafter gets the accepted path's features, in order
        features = target(torch.tensor([row + [int(last[b])] + path]), torch.arange(length)[None]).features
        torch.testing.assert_close(verdict.features[b, : len(path) + 1], features[0, len(row):], atol=1e-4, rtol=1e-4)


def _copy(cache: DynamicCache) -> DynamicCache:
    copy = DynamicCache()
    for index, layer in enumerate(cache.layers):
        copy.update(layer.keys.clone(), layer.values.clone(), index)
    return copy


def test_ancestor_matrix_is_ancestry():
    tree = DraftTree([0, 0, 1, 3, 2], [1, 1, 2, 3, 2], [0, 1, 0, 0, 0], [.5] * 5, [.5] * 5, [False] * 5)
    seen = ancestor_matrix(tree, 7)
    expected = {0: {0}, 1: {0, 1}, 2: {0, 2}, 3: {0, 1, 3}, 4: {0, 1, 3, 4}, 5: {0, 2, 5}, 6: {0, 6}}
    assert {i: {j for j in range(7) if seen[i, j]} for i in range(7)} == expected


# ---- sampling: the target's law --------------------------------------------------------------------------
TREE_STEPS = 4  # tokens sampled per row: the prefill's, then trees up to 2 deep (depth 1 alone at 3 tokens)


@pytest.fixture(scope="module")
def sampled_pair():
    """A 4-token vocabulary, a target sharp enough that p and the drafter's q differ (a wrong rule shows)."""
    model = tiny_target(vocab=4, layers=3, seed=21)
    return model, tiny_drafter(drafter_config(model, block_size=4), seed=6, std=0.5)


def _tree_samples(model, drafter, temperature, top_k, top_p, seed, nodes, verifier=None):
    result = generate(model, drafter, torch.tensor([PROMPT] * SAMPLES), max_new_tokens=TREE_STEPS,
                      temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, draft_length=3, tree=nodes,
                      verifier=verifier)
    return Counter(tuple(t) for t in result.tokens), result


@pytest.mark.parametrize("temperature,top_k,top_p,nodes", [(1.0, 0, 1.0, 3), (1.0, 0, 1.0, 6), (0.8, 3, 0.9, 5)])
def test_sampled_trees_keep_the_target_distribution(sampled_pair, temperature, top_k, top_p, nodes):
    model, drafter = sampled_pair
    counts, result = _tree_samples(model, drafter, temperature, top_k, top_p, 2, nodes)
    assert result.tau > 1.3, "several candidates must really be accepted for this test to mean anything"
    expected = exact_joint(model, temperature, top_k, top_p, steps=TREE_STEPS)
    assert chi_square_p(counts, expected, SAMPLES) > ALPHA


def _no_residual(p, q, candidates, generator):
    """Wrong on purpose: every candidate tested against p itself, no residual after a rejection."""
    proposal = q.float().clone()
    for j, token in enumerate(candidates):
        q_j = proposal / proposal.sum()
        if float(torch.rand((), generator=generator)) * float(q_j[token]) < float(p[token]):
            return j, None
        proposal[token] = 0.0
    return None, p.float()


@pytest.mark.parametrize("nodes", [3, 6])
def test_a_wrong_acceptance_rule_fails_the_same_test(sampled_pair, nodes):
    model, drafter = sampled_pair
    wrong = TreeVerifier(SamplingParams(temperature=1.0), torch.Generator().manual_seed(5), accept=_no_residual)
    counts, _ = _tree_samples(model, drafter, 1.0, 0, 1.0, 2, nodes, verifier=wrong)
    assert chi_square_p(counts, exact_joint(model, 1.0, 0, 1.0, steps=TREE_STEPS), SAMPLES) < ALPHA


def test_recursive_acceptance_gives_p_at_one_node():
    """One node, three children drawn from q without replacement: the committed token's law is p exactly
    (and not with the residual left out)."""
    p = torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15])
    q = torch.tensor([0.5, 0.1, 0.2, 0.1, 0.1])
    generator = torch.Generator().manual_seed(0)
    draws = draw_without_replacement(q.expand(6000, -1), 3, generator).tolist()

    def law(rule) -> float:
        counts = Counter()
        for children in draws:
            kept, residual = rule(p, q, children, generator)
            drawn = int(torch.multinomial(residual, 1, generator=generator)) if kept is None else children[kept]
            counts[drawn] += 1
        return chi_square_p(Counter({(t,): c for t, c in counts.items()}), {(t,): float(p[t]) for t in range(5)}, 6000)

    assert law(recursive_accept) > ALPHA
    assert law(_no_residual) < ALPHA


def test_draws_without_replacement_have_the_sequential_law():
    q = torch.tensor([0.5, 0.3, 0.2])
    draws = draw_without_replacement(q.expand(6000, -1), 2, torch.Generator().manual_seed(1)).tolist()
    expected = {(a, b): float(q[a] * q[b] / (1 - q[a])) for a in range(3) for b in range(3) if a != b}
    assert chi_square_p(Counter(tuple(d) for d in draws), expected, 6000) > ALPHA


# ---- growth, size, calibration ----------------------------------------------------------------------------
def test_best_first_growth_is_nested_and_ordered():
    probs = [[0.6, 0.3, 0.1], [0.9, 0.05, 0.05], [0.5, 0.5, 0.0]]
    tree = grow_tree(probs, 100, Calibration())
    assert all(p < i for i, p in enumerate(tree.parents, start=1))  # parents before children: prefixes are trees
    assert tree.scores == sorted(tree.scores, reverse=True)  # (with a monotone calibration)
    assert all(probs[d - 1][r] > 0 for d, r in zip(tree.depths, tree.ranks))  # no candidate of probability 0
    assert len(tree) == 3 + 3 * 3 + 3 * 3 * 2  # every positive candidate below every node, depth by depth
    assert grow_tree(probs, 7, Calibration()) == tree.first(7)  # fewer nodes: the same tree, cut
    chain = grow_tree([[1.0], [1.0], [1.0]], 10, Calibration())
    assert chain.parents == [0, 1, 2] and chain.ranks == [0, 0, 0]  # one candidate per depth: the chain


def test_calibration_learns_from_outcomes():
    calibration = Calibration()
    assert calibration(0.62) == pytest.approx(0.625)  # the prior: q itself (bin centre)
    for _ in range(50):
        calibration.record(0.62, True, False)
    assert calibration(0.62, True) < 0.1 and calibration(0.62) == pytest.approx(0.625)  # off-chain apart


def test_automatic_size_weighs_expected_tokens_against_verify_cost():
    """Flat verify cost (a GPU): the largest tree; verify cost growing with each token: none."""
    trees = [grow_tree([[0.5, 0.3, 0.2]] * 3, 12, Calibration())]
    flat = VerifyCostTable(seconds=(1.0,) * 4, draft_s=0.1, wide=((8, 1.0), (16, 1.0)))
    steep = VerifyCostTable(seconds=(1.0, 2.0, 3.0, 4.0), draft_s=0.1)
    source = TreeSource.__new__(TreeSource)
    source.costs = flat
    assert source._size(trees) == 12
    source.costs = steep
    assert source._size(trees) == 0


def test_wide_forwards_interpolate_the_cost_table():
    table = VerifyCostTable(seconds=(1.0, 1.0, 2.0, 2.0), draft_s=0.0, wide=((8, 4.0), (16, 12.0)))
    assert [table.verify(q) for q in (4, 6, 8, 12, 16, 20)] == [2.0, 3.0, 4.0, 8.0, 12.0, 16.0]
    assert VerifyCostTable.from_dict(table.to_dict()) == table
    with pytest.raises(ValueError, match="wide forwards"):
        VerifyCostTable(seconds=(1.0, 2.0), draft_s=0.0, wide=((2, 3.0),))


@pytest.mark.parametrize("tree", ["yes", 0, 65, True, 2.5])
def test_bad_tree_argument_is_one_clear_error(tree):
    model = tiny_target(vocab=8, layers=2)
    drafter = tiny_drafter(drafter_config(model, block_size=4))
    with pytest.raises(GenerationError, match="tree is .*expected 'off', 'auto' or a node count"):
        generate(model, drafter, torch.tensor([[1, 2]]), max_new_tokens=3, tree=tree)
