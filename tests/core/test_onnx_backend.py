"""The ONNX Runtime drafter backend: same lossless loop, exported graph, output == target alone."""

from __future__ import annotations

import pytest
import torch
from test_greedy_lossless import target_greedy
from tiny import drafter_config, tiny_drafter, tiny_target

from dflash_core import CheckpointError, CompatibilityError, generate
from dflash_core.tuning.cost_table import VerifyCostTable
from dflash_core.tuning.draft_length import DraftLengthPolicy
from dflash_core.tuning.plan import Tuning
from dflash_core.model.onnx_export import export_onnx
from dflash_core.model.ort_drafter import load_onnx_drafter


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = tiny_target(vocab=8, seed=12)
    drafter = tiny_drafter(drafter_config(model, block_size=6, layers=2, layer_ids=(1, 2)), seed=12)
    path = tmp_path_factory.mktemp("onnx") / "drafter.onnx"
    export_onnx(drafter, path)
    return model, drafter, path


def test_greedy_equals_target_and_torch_drafter(exported):
    model, drafter, path = exported
    onnx_drafter = load_onnx_drafter(path)
    assert onnx_drafter.config == drafter.config
    ids = torch.tensor([[1, 2, 3, 4, 5], [6, 5, 1, 0, 0], [2, 0, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    k = drafter.config.block_size - 1  # fixed, so both backends verify the same drafts
    via_onnx = generate(model, onnx_drafter, ids, attention_mask=mask, max_new_tokens=40, stop_token_ids=[7],
                        draft_length=k)
    via_torch = generate(model, drafter, ids, attention_mask=mask, max_new_tokens=40, stop_token_ids=[7],
                         draft_length=k)
    assert via_onnx.tokens == via_torch.tokens
    assert via_onnx.acceptance_lengths == via_torch.acceptance_lengths
    assert max(a for row in via_onnx.acceptance_lengths for a in row) > 1
    for row in range(3):
        prompt = ids[row][mask[row].bool()].tolist()
        assert via_onnx.tokens[row] == target_greedy(model, prompt, 40, [7])


def test_sampling_runs_and_is_seeded(exported):
    model, _, path = exported
    onnx_drafter = load_onnx_drafter(path)
    tuning = Tuning()  # one measured cost table for both calls: "auto" draft lengths follow it, and with them the draws
    a = generate(model, onnx_drafter, torch.tensor([[1, 2, 3]]), max_new_tokens=20, temperature=1.0, seed=5,
                 tuning=tuning)
    b = generate(model, onnx_drafter, torch.tensor([[1, 2, 3]]), max_new_tokens=20, temperature=1.0, seed=5,
                 tuning=tuning)
    assert a.tokens == b.tokens and len(a.tokens[0]) == 20


def test_bad_onnx_inputs(exported, tmp_path):
    model, _, _ = exported
    with pytest.raises(CheckpointError, match="does not exist"):
        load_onnx_drafter(tmp_path / "none.onnx")
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    with pytest.raises(CheckpointError, match="junk.onnx"):
        load_onnx_drafter(tmp_path / "junk.onnx")


def test_mismatched_target_is_refused(exported):
    _, _, path = exported
    with pytest.raises(CompatibilityError, match="hidden_size is 32 but the target's is 64"):
        generate(tiny_target(vocab=8, hidden=64), load_onnx_drafter(path), torch.tensor([[1]]), max_new_tokens=2)


class _Scripted(DraftLengthPolicy):
    """A policy that plays a fixed cycle of k (plain steps between drafting steps), for the test only."""

    def __init__(self, block: int, cycle: list[int]) -> None:
        super().__init__(VerifyCostTable(seconds=(1.0,) * block, draft_s=0.1), block)
        self.cycle, self.calls = cycle, 0

    def choose(self, rows: int = 1) -> int:
        self.calls += 1
        return self.cycle[(self.calls - 1) % len(self.cycle)]


@pytest.mark.parametrize("cycle", [[0, 0, 3], [2, 0, 0, 0, 5, 1], [0, 5]])
def test_mixed_draft_lengths_stay_lossless_on_both_backends(exported, cycle):
    """Plain steps (k = 0) queue their tokens' features; the next draft injects them all at once."""
    model, drafter, path = exported
    onnx_drafter = load_onnx_drafter(path)
    ids = torch.tensor([[1, 2, 3, 4, 5], [6, 5, 1, 0, 0], [2, 0, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    block = drafter.config.block_size
    fixed = generate(model, drafter, ids, attention_mask=mask, max_new_tokens=40, stop_token_ids=[7],
                     draft_length=block - 1)
    for backend in (drafter, onnx_drafter):
        mixed = generate(model, backend, ids, attention_mask=mask, max_new_tokens=40, stop_token_ids=[7],
                         draft_length=_Scripted(block, cycle))
        assert mixed.tokens == fixed.tokens
        assert max(a for row in mixed.acceptance_lengths for a in row) > 1  # drafts were accepted after plain steps
