"""`dflash_demo.marginal_ceiling`: the T > 0 tau ceiling of a block-parallel drafter, checked against exact
enumeration on a tiny target (vocabulary 12, block 3: every continuation can be listed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from dflash_demo.marginal_ceiling import chain_tau, main, marginal_ceiling, marginals, rollout
from tiny import tiny_target

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "models" / "demo"
VOCAB = 12


@pytest.fixture(scope="module")
def model():
    return tiny_target(vocab=VOCAB, hidden=32, layers=2, seed=3)


def _laws(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits.float().softmax(dim=-1)


def _exact(model, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(p1 [V], m2 [V], tau) for block 3 by listing every first token."""
    p1 = _laws(model, context)[0, -1]
    after = torch.cat([context.expand(VOCAB, -1), torch.arange(VOCAB)[:, None]], dim=1)
    p2 = _laws(model, after)[:, -1]  # [V (first token), V]
    m2 = (p1[:, None] * p2).sum(dim=0)
    kept2 = torch.minimum(p2, m2).sum(dim=1)  # a_2 for each first token (the first is always kept: m_1 = p_1)
    return p1, m2, 2.0 + (p1 * kept2).sum().item()


def test_cached_rollout_laws_equal_the_full_forward(model):
    context = torch.tensor([[1, 5, 7, 2]])
    tokens, laws = rollout(model, context, width=3, steps=4, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert tokens.shape == (3, 3) and laws.shape == (3, 4, VOCAB)
    full = _laws(model, torch.cat([context.expand(3, -1), tokens], dim=1))[:, context.shape[1] - 1:]
    torch.testing.assert_close(laws, full, atol=1e-5, rtol=1e-4)


def test_marginals_and_the_chain_match_exact_enumeration(model):
    context = torch.tensor([[4, 9, 1]])
    p1, m2, tau = _exact(model, context)
    estimate = marginals(model, context, block_size=3, samples=6000, temperature=1.0,
                         generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(estimate[0], p1)
    assert 0.5 * (estimate[1] - m2).abs().sum() < 0.02  # Rao-Blackwellised: close with a few thousand samples
    chained, kept = chain_tau(model, context, torch.stack([p1, m2]), chains=6000, temperature=1.0,
                              generator=torch.Generator().manual_seed(2))
    assert 2.0 < tau < 3.0 and chained == pytest.approx(tau, abs=0.01)
    assert kept[0] == pytest.approx(1.0, abs=1e-5) and kept[1] == pytest.approx(tau - 2.0, abs=0.01)


def test_the_chain_is_exact_for_any_proposal(model):
    """Drafts from another law (uniform at position 2): the chain still matches the enumerated acceptance."""
    context = torch.tensor([[4, 9, 1]])
    p1, _, _ = _exact(model, context)
    uniform = torch.full((VOCAB,), 1.0 / VOCAB)
    after = torch.cat([context.expand(VOCAB, -1), torch.arange(VOCAB)[:, None]], dim=1)
    kept2 = torch.minimum(_laws(model, after)[:, -1], uniform).sum(dim=1)
    tau = 2.0 + (p1 * kept2).sum().item()
    chained, _ = chain_tau(model, context, torch.stack([p1, uniform]), chains=6000, temperature=1.0,
                           generator=torch.Generator().manual_seed(2))
    assert chained == pytest.approx(tau, abs=0.01)


def test_at_temperature_zero_the_ceiling_is_the_whole_block(model):
    prompts = [torch.tensor([[3, 1, 4, 1, 5]]), torch.tensor([[2, 7]])]
    result = marginal_ceiling(model, prompts, block_size=5, temperature=0.0, samples=4, chains=4,
                              max_new_tokens=8, stride=4)
    assert result["tau"] == 5.0 and result["per_prompt"] == [5.0, 5.0] and result["contexts_per_prompt"] == 2
    assert result["kept_by_position"] == [1.0] * 4


def test_cli_writes_the_ceiling_of_the_demo_target(tmp_path, capsys):
    out = tmp_path / "ceiling.json"
    assert main(["--target", str(DEMO / "target"), "--prompts", str(DEMO / "heldout.jsonl"), "--count", "2",
                 "--samples", "8", "--chains", "8", "--max-new-tokens", "8", "--stride", "4", "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert 1.0 <= written["tau"] <= 16.0 and len(written["per_prompt"]) == 2 and written["temperature"] == 1.0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tau"] == written["tau"]


@pytest.mark.parametrize("flag, value", [("--samples", "0"), ("--block-size", "1"), ("--temperature", "-1")])
def test_bad_settings_are_refused_before_anything_loads(tmp_path, capsys, flag, value):
    out = tmp_path / "ceiling.json"
    with pytest.raises(SystemExit) as refused:
        main(["--target", str(tmp_path / "missing"), "--prompts", str(tmp_path / "missing.jsonl"), flag, value,
              "--out", str(out)])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert refused.value.code == 2 and flag in error and "expected" in error and not out.exists()
