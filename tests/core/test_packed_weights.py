"""fp16-packed drafter weights (FBGEMM, fp32 arithmetic) for fp32 CPU decoding: the kernel's numbers,
its fallback above the measured row limit, and that decoding with it stays exactly lossless."""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from test_draft_length import _refuse, _tiny_pair
from test_greedy_lossless import target_greedy
from test_sampling_lossless import ALPHA, PROMPT, SAMPLES, STEPS, chi_square_p, exact_joint
from tiny import drafter_config, save_tiny_pair, tiny_drafter, tiny_target

from dflash_core import generate, load_pair
from dflash_core.tuning.cost_table import COST_FILE
from dflash_core.tuning.plan import Tuning
from dflash_core.model.draft_vocab import draft_head_for, read_out_for
from dflash_core.errors import CompatibilityError
from dflash_core.kernels.packed_weights import (ROW_PROBES, PackedFp16Linear, bf16_matmuls_supported, format_supported,
                                        fp16_packing_supported, linear, measure_row_limit, packed_matmuls)

pytestmark = pytest.mark.skipif(not fp16_packing_supported("cpu", torch.float32),
                                reason="FBGEMM's fp16-weight GEMM needs a CPU with AVX2 (and a torch built with FBGEMM)")

EVERY_ROW = 10**9  # a row limit no test input reaches: the packed kernel on every call


def _packed_everywhere(drafter, model) -> None:
    """Pack the drafter (and its read-out heads) for decoding, with the kernel used at any row count."""
    copies_everywhere(drafter, model, "fp16-packed", lambda copy: setattr(copy, "max_rows", EVERY_ROW))


def copies_everywhere(drafter, model, weight_format: str, force) -> None:
    """Copy the drafter's matmuls and its read-out heads for decoding in `weight_format`; `force(copy)` fixes
    the kernel each copy uses (so the copy, not fp32, runs at every row count)."""
    drafter.use_weight_format(weight_format)
    with torch.inference_mode():
        matmuls = packed_matmuls(drafter.decode_weights())
        target = SimpleNamespace(model=model)
        heads = [draft_head_for(drafter, target)]
        if drafter.draft_vocab is not None:
            heads.append(read_out_for(drafter, target).packed)
    assert len(matmuls) == 2 + 4 * len(drafter.layers) and all(h is not None for h in heads)
    for copy in matmuls + heads:
        force(copy)


def test_packed_matmul_is_fp32_arithmetic_on_the_fp16_rounded_weight():
    gen = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(40, 24, generator=gen), torch.randn(40, generator=gen)
    packed = PackedFp16Linear(weight, bias, max_rows=EVERY_ROW)
    rounded = weight.half().float()
    for shape in [(1, 24), (7, 24), (2, 5, 24)]:
        x = torch.randn(*shape, generator=gen)
        out = packed(x)
        assert out.shape == (*shape[:-1], 40) and out.dtype == torch.float32
        torch.testing.assert_close(out, F.linear(x, rounded, bias), rtol=1e-5, atol=1e-5)
        assert not torch.allclose(out, F.linear(x, weight, bias), rtol=0, atol=1e-6)  # really the fp16 copy
    bias_free = PackedFp16Linear(weight, max_rows=EVERY_ROW)
    x = torch.randn(3, 24, generator=gen)
    torch.testing.assert_close(linear(x, bias_free), F.linear(x, rounded), rtol=1e-5, atol=1e-5)
    assert torch.equal(linear(x, weight), F.linear(x, weight))  # a plain tensor is plain F.linear


def test_inputs_over_the_row_limit_are_plain_fp32_on_the_original_weight():
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(16, 8, generator=gen)
    packed = PackedFp16Linear(weight, max_rows=4)
    assert packed.weight.data_ptr() == weight.data_ptr()  # kept by reference, not copied
    over = torch.randn(2, 3, 8, generator=gen)  # 6 rows > 4
    assert torch.equal(packed(over), F.linear(over, weight))
    under = torch.randn(4, 8, generator=gen)
    torch.testing.assert_close(packed(under), F.linear(under, weight.half().float()), rtol=1e-5, atol=1e-5)
    assert measure_row_limit(packed, repeats=1) in (0, *ROW_PROBES)
    assert PackedFp16Linear(weight).max_rows in (0, *ROW_PROBES)  # None: measured when made


@pytest.mark.parametrize("weight", [torch.zeros(4, 4, dtype=torch.bfloat16), torch.zeros(2, 4, 4), torch.zeros(4)])
def test_weights_it_cannot_pack_are_refused_by_name(weight):
    with pytest.raises(ValueError, match=r"expected a 2D fp32 CPU weight, got"):
        PackedFp16Linear(weight)


def test_supported_only_for_fp32_on_a_cpu():
    assert not fp16_packing_supported("cpu", torch.bfloat16)
    assert not fp16_packing_supported("meta", torch.float32)


def test_weight_format_is_checked_and_training_never_sees_the_packed_copy():
    model = tiny_target(vocab=32, layers=2)
    drafter = tiny_drafter(drafter_config(model, block_size=4))
    with pytest.raises(ValueError, match=r"weight format 'int8' is not one of plain, fp16-packed"):
        drafter.use_weight_format("int8")
    bf16 = tiny_drafter(drafter_config(model, block_size=4), dtype=torch.bfloat16)
    with pytest.raises(CompatibilityError, match=r"fp16-packed weights need an fp32 drafter on a CPU"):
        bf16.use_weight_format("fp16-packed")
    assert bf16.weight_format == "plain"
    drafter.use_weight_format("fp16-packed")
    with torch.no_grad():
        packed = drafter.decode_weights()
        assert len(packed_matmuls(packed)) == 6 and drafter.decode_weights() is packed  # packed once
    assert packed_matmuls(drafter.decode_weights()) == []  # gradients on (training): the parameters
    with torch.no_grad():
        drafter.fc.weight.add_(0.01)  # new parameters: a fresh packed copy
        assert drafter.decode_weights() is not packed and packed_matmuls(drafter.decode_weights())
        drafter.use_weight_format("plain")
        assert packed_matmuls(drafter.decode_weights()) == []


def greedy_pair(seed: int, block: int, layers: int, draft_vocab: bool):
    """A tiny target and drafter (with a read-out list when `draft_vocab`) for the weight-copy lossless tests."""
    model = tiny_target(vocab=64, layers=3, seed=seed)
    drafter = tiny_drafter(drafter_config(model, block_size=block, layers=layers), seed=seed + 7)
    if draft_vocab:
        drafter.draft_vocab = list(range(0, 64, 2))
    return model, drafter


def assert_greedy_is_the_target_alone(model, drafter, block: int) -> None:
    """Single prompts at auto and the whole block, and a ragged batch: each row the target's greedy continuation."""
    prompts = [[3, 5, 7, 9, 11], [2, 4], [8, 1, 8, 1, 8, 1, 8]]
    for k in ("auto", block - 1):
        for prompt in prompts:
            result = generate(model, drafter, torch.tensor([prompt]), max_new_tokens=20, draft_length=k)
            assert result.tokens[0] == target_greedy(model, prompt, 20), (k, prompt)
    # ragged batch, left-padded: every row is its own greedy continuation
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    batch = generate(model, drafter, ids, attention_mask=mask, max_new_tokens=16, draft_length=block - 1)
    assert batch.tokens == [target_greedy(model, p, 16) for p in prompts]


@pytest.mark.parametrize("seed,block,layers,draft_vocab", [(0, 4, 1, False), (1, 8, 2, False), (2, 4, 2, True)])
def test_greedy_decoding_with_packed_weights_is_the_target_alone(seed, block, layers, draft_vocab):
    model, drafter = greedy_pair(seed, block, layers, draft_vocab)
    _packed_everywhere(drafter, model)
    assert_greedy_is_the_target_alone(model, drafter, block)
    assert "fp16-packed" in drafter._copies  # the packed copy is what drafted


def sampling_pair():
    """A 4-token tiny pair where every sequence is plausible (as in test_sampling_lossless)."""
    model = tiny_target(vocab=4, layers=3, seed=21)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.3)
    return model, tiny_drafter(drafter_config(model, block_size=4), seed=5)


def assert_samples_follow_the_target(model, drafter) -> None:
    """Chi-square of sampled sequences against the target's exact joint; drafts really accepted."""
    result = generate(model, drafter, torch.tensor([PROMPT] * SAMPLES), max_new_tokens=STEPS, temperature=1.0,
                      seed=0, draft_length=3)
    assert result.tau > 1.05, "drafts must really be accepted for this test to mean anything"
    counts = Counter(tuple(t) for t in result.tokens)
    assert chi_square_p(counts, exact_joint(model, 1.0, 0, 1.0), SAMPLES) > ALPHA


def test_sampling_with_packed_weights_keeps_the_target_distribution():
    model, drafter = sampling_pair()
    _packed_everywhere(drafter, model)
    assert_samples_follow_the_target(model, drafter)
    tuning = Tuning()  # one cost table for both calls (draft lengths decide which draws a seed feeds)
    again = generate(model, drafter, torch.tensor([PROMPT] * 8), max_new_tokens=12, temperature=1.0, seed=3,
                     tuning=tuning).tokens
    assert again == generate(model, drafter, torch.tensor([PROMPT] * 8), max_new_tokens=12, temperature=1.0,
                             seed=3, tuning=tuning).tokens  # a seed still reproduces


def assert_costed_by_its_own_table(tmp_path, monkeypatch, weight_format: str) -> None:
    """A drafter decoding weight copies gets a cost table of its own, keyed `|weights=<format>` after plain's."""
    target, drafter = _tiny_pair()
    tuning = Tuning(tmp_path)
    plain = tuning.cost_table(target, drafter, spot=_refuse)
    drafter.use_weight_format(weight_format)
    copied = tuning.cost_table(target, drafter, spot=_refuse)
    keys = list(json.loads((tmp_path / COST_FILE).read_text()))
    assert copied is not plain and keys[1] == keys[0] + f"|weights={weight_format}"  # plain keeps the keys it had


def test_packed_drafters_are_costed_by_their_own_table(tmp_path, monkeypatch):
    assert_costed_by_its_own_table(tmp_path, monkeypatch, "fp16-packed")


def test_load_pair_chooses_or_is_told_the_weight_format(tmp_path):
    target_dir, drafter_dir = save_tiny_pair(tmp_path)
    with pytest.raises(ValueError, match=r"drafter_weights 'fp8' is not one of auto, plain, fp16-packed"):
        load_pair(target_dir, drafter_dir, dtype="fp32", drafter_weights="fp8")
    plain = load_pair(target_dir, drafter_dir, dtype="fp32", drafter_weights="plain")
    assert plain.drafter.weight_format == "plain" and not any("drafter weights" in n for n in plain.notes)
    auto = load_pair(target_dir, drafter_dir, dtype="fp32")
    (note,) = [n for n in auto.notes if n.startswith("drafter weights")]
    tried = ["bf16"] if bf16_matmuls_supported("cpu", torch.float32) else []  # bf16 in hardware first
    if auto.drafter.weight_format == "fp16-packed":
        assert "fp16-packed (FBGEMM, fp32 arithmetic) for" in note and "of 6 matmuls" in note
    elif auto.drafter.weight_format == "bf16":
        assert tried and "bf16 copies (native bf16 matmuls, fp32 in and out) for" in note, note
    else:
        assert note == (f"drafter weights plain: {' and '.join(tried + ['fp16-packed'])} matmuls were not faster "
                        "than fp32 on this CPU")
    told = load_pair(target_dir, drafter_dir, dtype="fp32", drafter_weights="fp16-packed")
    assert told.drafter.weight_format == "fp16-packed"  # asked for: kept even where it measured slower
    with pytest.raises(CompatibilityError, match=r"need an fp32 drafter"):
        load_pair(target_dir, drafter_dir, dtype="bf16", drafter_weights="fp16-packed")
    # a bf16 drafter: auto can only prepack for oneDNN (where this torch can), and keeps that where it measured faster
    bf16 = load_pair(target_dir, drafter_dir, dtype="bf16")
    kept = ("plain", "bf16-prepacked") if format_supported("bf16-prepacked", "cpu", torch.bfloat16) else ("plain",)
    assert bf16.drafter.weight_format in kept


def test_each_weight_format_keeps_its_own_read_out_across_switches():
    """dflash bench's dflash_plain_weights switches formats per run: neither read-out is rebuilt (re-packed, re-timed)."""
    model = tiny_target(vocab=32, layers=2)
    drafter = tiny_drafter(drafter_config(model, block_size=4))
    drafter.draft_vocab = [1, 2, 5, 7]
    target = SimpleNamespace(model=model)
    with torch.inference_mode():
        drafter.use_weight_format("fp16-packed")
        packed = read_out_for(drafter, target)
        drafter.use_weight_format("plain")
        plain = read_out_for(drafter, target)
        drafter.use_weight_format("fp16-packed")
        assert read_out_for(drafter, target) is packed and packed.packed is not None
        drafter.use_weight_format("plain")
        assert read_out_for(drafter, target) is plain and plain.packed is None
    with torch.no_grad():
        model.lm_head.weight.add_(0.01)  # a changed head: a fresh copy of its rows
    assert read_out_for(drafter, target) is not plain
