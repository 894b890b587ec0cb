"""A bf16 drafter's matmul weights prepacked for oneDNN (`PrepackedBf16Linear`): the same bits as plain, so the
same drafts and the same decoding; who may use the format."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tiny import drafter_config, save_tiny_pair, tiny_drafter, tiny_target

from dflash_core import load_pair
from dflash_core.kernels import packed_weights
from dflash_core.decode.loop import generate
from dflash_core.errors import CompatibilityError
from dflash_core.kernels.packed_weights import PrepackedBf16Linear, packed_matmuls

needs_onednn = pytest.mark.skipif(not packed_weights.bf16_prepacking_supported("cpu", torch.bfloat16),
                                  reason="no oneDNN bf16 packed-linear kernels here (an AVX2-only CPU)")


@needs_onednn
@pytest.mark.parametrize("bias", [False, True])
def test_the_same_bits_as_f_linear(bias):
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 32, generator=generator).to(torch.bfloat16)
    b = torch.randn(48, generator=generator).to(torch.bfloat16) if bias else None
    copy = PrepackedBf16Linear(weight, b)
    for shape in ((1, 32), (16, 32), (2, 7, 32)):
        x = torch.randn(*shape, generator=generator).to(torch.bfloat16)
        assert torch.equal(copy(x), F.linear(x, weight, b))
    with pytest.raises(ValueError, match="2D bf16 CPU weight"):
        PrepackedBf16Linear(weight.float())


@needs_onednn
def test_a_bf16_drafter_decodes_the_same_tokens_prepacked():
    model = tiny_target(layers=3, seed=5).to(torch.bfloat16)
    drafter = tiny_drafter(drafter_config(model, block_size=6), seed=5).to(torch.bfloat16)
    ids = torch.randint(0, 64, (2, 11), generator=torch.Generator().manual_seed(6))
    plain = generate(model, drafter, ids, max_new_tokens=30, draft_length=5)
    drafter.use_weight_format("bf16-prepacked")
    with torch.inference_mode():
        copies = packed_matmuls(drafter.decode_weights())
    assert len(copies) == 6 and all(isinstance(c, PrepackedBf16Linear) for c in copies)
    packed = generate(model, drafter, ids, max_new_tokens=30, draft_length=5)
    assert packed.tokens == plain.tokens and packed.acceptance_lengths == plain.acceptance_lengths
    assert "bf16-prepacked" in drafter._copies  # the prepacked copy is what drafted


def test_only_bf16_cpu_drafters_may_use_it():
    drafter = tiny_drafter(drafter_config(tiny_target(layers=2)))  # fp32
    with pytest.raises(CompatibilityError, match="bf16-prepacked weights need a bf16 drafter"):
        drafter.use_weight_format("bf16-prepacked")
    assert not packed_weights.format_supported("bf16-prepacked", "cpu", torch.float32)


@needs_onednn
def test_load_pair_tries_it_for_bf16_drafters(tmp_path):
    target_dir, drafter_dir = save_tiny_pair(tmp_path)
    pair = load_pair(target_dir, drafter_dir, dtype="bf16")
    notes = [n for n in pair.notes if n.startswith("drafter weights")]
    if pair.drafter.weight_format == "bf16-prepacked":
        assert "bf16 prepacked for oneDNN (the same bits) for" in notes[0] and "than plain bf16" in notes[0]
    else:  # no matmul measured faster on this machine: plain, and said so
        assert pair.drafter.weight_format == "plain" and "bf16-prepacked" in notes[0]
