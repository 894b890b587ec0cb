"""bf16 copies of the drafter's matmul weights for fp32 CPU decoding (`Bf16Linear`): each kernel's numbers, the
choice per row count, who may use them, and that decoding with them stays exactly lossless.

The kernels are real torch bf16 matmuls; on a CPU without bf16 in hardware they are emulated (slow, still the same
numbers), so where a test needs the format it allows it on every machine by patching the hardware check only."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_packed_weights import (assert_costed_by_its_own_table, assert_greedy_is_the_target_alone,
                                 assert_samples_follow_the_target, copies_everywhere, greedy_pair, sampling_pair)
from tiny import drafter_config, save_tiny_pair, tiny_drafter, tiny_target

from dflash_core import load_pair
from dflash_core.kernels import packed_weights
from dflash_core.errors import CompatibilityError
from dflash_core.kernels.packed_weights import BF16_KERNELS, BF16_ROW_PROBES, Bf16Linear, measure_kernels, packed_matmuls


@pytest.fixture
def bf16_allowed(monkeypatch):
    """The format allowed for fp32 CPU drafters whatever the CPU (only the hardware check is patched)."""
    monkeypatch.setattr(packed_weights, "bf16_matmuls_supported",
                        lambda device, dtype: torch.device(device).type == "cpu" and dtype == torch.float32)


def _bf16_everywhere(drafter, model, kernel: str = "bf16-transposed") -> None:
    """Copy the drafter (and its read-out heads) to bf16 for decoding, with `kernel` at every row count."""
    everywhere = dict.fromkeys(BF16_ROW_PROBES, kernel)
    copies_everywhere(drafter, model, "bf16", lambda copy: setattr(copy, "choices", everywhere))
    with torch.inference_mode():
        copies = packed_matmuls(drafter.decode_weights())
    assert copies and all(isinstance(w, Bf16Linear) for w in copies)


@pytest.mark.parametrize("kernel", ["bf16", "bf16-transposed"])
def test_bf16_kernels_multiply_the_bf16_rounded_operands(kernel):
    gen = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(40, 24, generator=gen), torch.randn(40, generator=gen)
    copy = Bf16Linear(weight, bias, choices=dict.fromkeys(BF16_ROW_PROBES, kernel))
    assert copy.weight.data_ptr() == weight.data_ptr() and copy.copy.dtype == torch.bfloat16  # original by reference
    for shape in [(1, 24), (7, 24), (2, 5, 24), (300, 24)]:  # 300 rows: beyond the last probe, its choice
        x = torch.randn(*shape, generator=gen)
        out = copy(x)
        assert out.shape == (*shape[:-1], 40) and out.dtype == torch.float32
        rounded = F.linear(x.bfloat16().float(), weight.bfloat16().float(), bias)
        torch.testing.assert_close(out, rounded, rtol=2e-2, atol=2e-2)  # bf16 products, fp32 sums
        assert not torch.allclose(out, F.linear(x, weight, bias), rtol=0, atol=1e-4)  # really the bf16 copy


def test_each_row_count_takes_its_buckets_kernel_and_fp32_is_exact():
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(16, 8, generator=gen)
    copy = Bf16Linear(weight, choices={1: "fp32", 2: "bf16", 4: "fp32", 8: "bf16-transposed"})
    assert [copy.kernel_for(r) for r in (1, 2, 3, 4, 5, 8, 9, 256, 10**6)] == [
        "fp32", "bf16", "fp32", "fp32", "bf16-transposed", "bf16-transposed", "fp32", "fp32", "fp32"]  # unset: fp32
    for rows in (1, 3, 4, 9):
        x = torch.randn(rows, 8, generator=gen)
        assert torch.equal(copy(x), F.linear(x, weight))  # fp32 buckets are plain F.linear on the original
    x = torch.randn(2, 8, generator=gen)
    assert not torch.equal(copy(x), F.linear(x, weight))
    measured = measure_kernels(copy, repeats=1)
    assert set(measured) == set(BF16_ROW_PROBES) and set(measured.values()) <= set(BF16_KERNELS)
    assert set(Bf16Linear(weight).choices.values()) <= set(BF16_KERNELS)  # choices None: measured when made


@pytest.mark.parametrize("weight", [torch.zeros(4, 4, dtype=torch.bfloat16), torch.zeros(2, 4, 4), torch.zeros(4)])
def test_weights_it_cannot_copy_are_refused_by_name(weight):
    with pytest.raises(ValueError, match=r"expected a 2D fp32 CPU weight, got"):
        Bf16Linear(weight)


def test_the_format_is_for_fp32_cpu_drafters_on_bf16_hardware_only(monkeypatch):
    assert not packed_weights.bf16_matmuls_supported("cpu", torch.bfloat16)
    assert not packed_weights.bf16_matmuls_supported("meta", torch.float32)
    model = tiny_target(vocab=32, layers=2)
    drafter = tiny_drafter(drafter_config(model, block_size=4))
    monkeypatch.setattr(packed_weights, "bf16_matmuls_supported", lambda device, dtype: False)
    with pytest.raises(CompatibilityError, match=r"bf16 weight copies need an fp32 drafter on a CPU with AMX-BF16"):
        drafter.use_weight_format("bf16")
    assert drafter.weight_format == "plain"


def test_copies_follow_the_parameters_and_training_never_sees_them(bf16_allowed):
    model = tiny_target(vocab=32, layers=2)
    drafter = tiny_drafter(drafter_config(model, block_size=4))
    drafter.use_weight_format("bf16")
    assert drafter.decoding_format == "bf16" and drafter.packs_weights
    with torch.no_grad():
        copied = drafter.decode_weights()
        assert len(packed_matmuls(copied)) == 6 and drafter.decode_weights() is copied  # copied once
    assert packed_matmuls(drafter.decode_weights()) == []  # gradients on (training): the parameters
    with torch.no_grad():
        drafter.fc.weight.add_(0.01)  # new parameters: a fresh copy
        assert drafter.decode_weights() is not copied and packed_matmuls(drafter.decode_weights())
    drafter.to(torch.bfloat16)  # no longer an fp32 drafter: decoding reads the parameters
    assert drafter.decoding_format == "plain" and not drafter.packs_weights


@pytest.mark.parametrize("kernel", ["bf16", "bf16-transposed"])
@pytest.mark.parametrize("seed,block,layers,draft_vocab", [(0, 4, 1, False), (1, 8, 2, True)])
def test_greedy_decoding_with_bf16_copies_is_the_target_alone(bf16_allowed, kernel, seed, block, layers, draft_vocab):
    model, drafter = greedy_pair(seed, block, layers, draft_vocab)
    _bf16_everywhere(drafter, model, kernel)
    assert_greedy_is_the_target_alone(model, drafter, block)
    assert "bf16" in drafter._copies  # the bf16 copy is what drafted


def test_sampling_with_bf16_copies_keeps_the_target_distribution(bf16_allowed):
    model, drafter = sampling_pair()
    _bf16_everywhere(drafter, model)
    assert_samples_follow_the_target(model, drafter)


def test_bf16_drafters_are_costed_by_their_own_table(bf16_allowed, tmp_path, monkeypatch):
    assert_costed_by_its_own_table(tmp_path, monkeypatch, "bf16")


def test_load_pair_tries_bf16_first_where_the_cpu_has_it(bf16_allowed, tmp_path):
    target_dir, drafter_dir = save_tiny_pair(tmp_path)
    auto = load_pair(target_dir, drafter_dir, dtype="fp32")
    (note,) = [n for n in auto.notes if n.startswith("drafter weights")]
    if auto.drafter.weight_format == "bf16":
        assert "bf16 copies (native bf16 matmuls, fp32 in and out) for" in note and "of 6 matmuls, at " in note
    elif auto.drafter.weight_format == "fp16-packed":  # bf16 lost everywhere: the next kind was tried
        assert "fp16-packed (FBGEMM, fp32 arithmetic) for" in note
    else:
        assert note.startswith("drafter weights plain: bf16") and note.endswith("matmuls were not faster than fp32 on "
                                                                                "this CPU")


def test_auto_falls_back_to_fp16_packing_where_bf16_copies_never_win(bf16_allowed, tmp_path, monkeypatch):
    """A CPU whose bf16 copies lose at every row count (measured here as losing) gets the fp16-packed kind next."""
    if not packed_weights.fp16_packing_supported("cpu", torch.float32):
        pytest.skip("FBGEMM's fp16-weight GEMM is missing here")
    monkeypatch.setattr(packed_weights, "measure_kernels", lambda copy: dict.fromkeys(BF16_ROW_PROBES, "fp32"))
    monkeypatch.setattr(packed_weights, "measure_row_limit", lambda copy: 8)
    target_dir, drafter_dir = save_tiny_pair(tmp_path)
    auto = load_pair(target_dir, drafter_dir, dtype="fp32")
    (note,) = [n for n in auto.notes if n.startswith("drafter weights")]
    assert auto.drafter.weight_format == "fp16-packed" and "for 6 of 6 matmuls, at 1-8 rows" in note, note
    monkeypatch.setattr(packed_weights, "measure_row_limit", lambda copy: 0)
    plain = load_pair(target_dir, drafter_dir, dtype="fp32")
    assert plain.drafter.weight_format == "plain" and (
        "drafter weights plain: bf16 and fp16-packed matmuls were not faster than fp32 on this CPU" in plain.notes)
    told = load_pair(target_dir, drafter_dir, dtype="fp32", drafter_weights="bf16")
    assert told.drafter.weight_format == "bf16"  # asked for: kept even where it measured slower
    with pytest.raises(CompatibilityError, match=r"bf16 weight copies need an fp32 drafter"):
        load_pair(target_dir, drafter_dir, dtype="bf16", drafter_weights="bf16")
