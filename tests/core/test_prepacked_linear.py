"""bf16 linear layers with weights prepacked for oneDNN: the same bits as `F.linear`, decoding unchanged."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from dflash_core.decode.autoregressive import generate_autoregressive
from dflash_core.decode.loop import generate
from dflash_core.loading import load_pair
from dflash_core.kernels.prepacked_linear import _PackedForward, prepack_linears, prepack_supported
from tiny import drafter_config, save_tiny_pair, tiny_drafter, tiny_target

needs_onednn = pytest.mark.skipif(not prepack_supported(nn.Linear(4, 4).to(torch.bfloat16)),
                                  reason="no oneDNN bf16 packed-linear kernels here (an AVX2-only CPU)")


@needs_onednn
def test_every_projection_computes_the_same_bits_packed():
    model = tiny_target(layers=2, hidden=64, seed=3).to(torch.bfloat16)
    ids = torch.randint(0, 64, (2, 21), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        plain = model(ids).logits
        count = prepack_linears(model, measure=False)  # whether it pays is the machine's; exactness is tested
        packed = model(ids).logits
    linears = [m for m in model.modules() if type(m) is nn.Linear]
    assert count == len(linears) and all(isinstance(m.forward, _PackedForward) for m in linears)
    assert torch.equal(plain, packed)
    with torch.inference_mode():
        assert prepack_linears(model, measure=False) == 0  # already packed: nothing twice


@needs_onednn
def test_a_weight_changed_after_packing_or_a_gradient_falls_back_to_plain():
    linear = nn.Linear(32, 48, bias=True).to(torch.bfloat16)
    packed = _PackedForward(linear)
    x = torch.randn(3, 5, 32).to(torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(packed(x), nn.functional.linear(x, linear.weight, linear.bias))
    with torch.no_grad():
        linear.weight.mul_(2)  # the packed copy is now stale
    with torch.inference_mode():
        assert torch.equal(packed(x), nn.functional.linear(x, linear.weight, linear.bias))
    out = _PackedForward(linear)(x)  # grad enabled, weight requires grad: plain, differentiable
    out.float().sum().backward()
    assert linear.weight.grad is not None


def test_fp32_and_other_devices_are_left_alone():
    model = tiny_target(layers=1, seed=0)  # fp32
    assert not prepack_supported(model) and prepack_linears(model) == 0
    assert all(not isinstance(m.forward, _PackedForward) for m in model.modules() if type(m) is nn.Linear)


@needs_onednn
def test_a_bf16_pair_decodes_as_before(tmp_path):
    target_dir, drafter_dir = save_tiny_pair(tmp_path)
    pair = load_pair(target_dir, drafter_dir, dtype="bf16")
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(4))
    packed = [m for m in pair.target.model.modules() if isinstance(m.forward, _PackedForward)]
    # load_pair packs where it measured a gain (a note says so); the tiny pair may not gain: pack it regardless
    assert bool(packed) == any(note.startswith("target: ") and "prepacked" in note for note in pair.notes)
    with torch.inference_mode():
        prepack_linears(pair.target.model, measure=False)
    assert all(isinstance(m.forward, _PackedForward) for m in pair.target.model.modules() if type(m) is nn.Linear)
    spec = generate(pair.target, pair.drafter, ids, max_new_tokens=20, draft_length=3)
    alone = generate_autoregressive(pair.target, ids, max_new_tokens=20)
    for module in pair.target.model.modules():  # the same model, unpacked
        module.__dict__.pop("forward", None)
    plain_alone = generate_autoregressive(pair.target, ids, max_new_tokens=20)
    assert alone.tokens == plain_alone.tokens
    assert len(spec.tokens[0]) == 20


def test_the_dtype_probe_times_bf16_as_decoding_reads_it_and_leaves_the_model_alone(monkeypatch):
    from dflash_core.tuning import auto_dtype
    from dflash_core.kernels import prepacked_linear

    packed_models = []
    real = prepacked_linear.prepack_linears
    monkeypatch.setattr(auto_dtype, "prepack_linears", lambda m, **kw: packed_models.append(m) or real(m, **kw))
    model = tiny_target(layers=1, seed=2)  # fp32: the bf16 probe runs on a cast copy
    costs = auto_dtype.probe_forward_costs(model, torch.bfloat16, 4, context=8, repeats=1)
    assert costs["dtype"] == "bf16" and len(packed_models) == 1 and packed_models[0] is not model
    assert not any(isinstance(m.__dict__.get("forward"), _PackedForward) for m in model.modules())


@needs_onednn
def test_a_packed_model_can_be_copied_and_cast():
    import copy

    model = tiny_target(layers=1, seed=4).to(torch.bfloat16)
    with torch.inference_mode():
        prepack_linears(model, measure=False)
    ids = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(0))
    twin = copy.deepcopy(model)
    assert all(isinstance(m.__dict__.get("forward"), _PackedForward) and m.forward.linear is m
               for m in twin.modules() if type(m) is nn.Linear)  # each copy packs its own copied weight
    with torch.inference_mode():
        assert torch.equal(twin(ids).logits, model(ids).logits)
        as_fp32 = model.float()(ids).logits  # cast after packing: the packed bf16 copies are not used
        plain = tiny_target(layers=1, seed=4).to(torch.bfloat16).float()(ids).logits
    assert as_fp32.dtype == torch.float32 and torch.equal(as_fp32, plain)


_WITHOUT_ONEDNN_BF16 = """
import sys, torch
from dflash_core.tuning.auto_dtype import describe_machine, machine_key, probe_forward_costs
from dflash_core.decode.autoregressive import generate_autoregressive
from dflash_core.decode.loop import generate
from dflash_core.loading import load_pair
from dflash_core.kernels.packed_weights import bf16_matmuls_supported
from dflash_core.kernels.prepacked_linear import prepack_linears, prepacking_available

assert not prepacking_available("cpu", torch.bfloat16) and not bf16_matmuls_supported("cpu", torch.float32)
assert "no-onednn-bf16" in machine_key()  # timings cached under full kernels are not read back here
assert "bf16 matmuls are emulated" in describe_machine()  # what the dtype note says, whatever the CPU's flags
pair = load_pair(sys.argv[1], sys.argv[2], dtype="bf16")
with torch.inference_mode():
    assert prepack_linears(pair.target.model, measure=False) == 0
ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(4))
spec = generate(pair.target, pair.drafter, ids, max_new_tokens=12)
assert spec.tokens == generate_autoregressive(pair.target, ids, max_new_tokens=12).tokens
assert probe_forward_costs(pair.target.model.float(), torch.bfloat16, 4, context=8, repeats=1)["dtype"] == "bf16"
print("ok")
"""


def test_a_cpu_without_native_bf16_decodes_bf16_unpacked(tmp_path):
    """oneDNN has no bf16 kernels on an AVX2-only CPU and refuses to prepack bf16 weights there: bf16 still
    decodes, and the dtype probe times it, through plain (emulated) matmuls; no bf16 drafter copies are made.
    ONEDNN_MAX_CPU_ISA=AVX2 makes any CPU such a CPU for oneDNN."""
    import os
    import subprocess
    import sys

    target_dir, drafter_dir = save_tiny_pair(tmp_path)
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _WITHOUT_ONEDNN_BF16, str(target_dir), str(drafter_dir)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
