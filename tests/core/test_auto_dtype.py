"""dtype='auto': bf16 only when measured faster on both shapes; the choice is cached per machine and model."""

from __future__ import annotations

import json

import pytest
import torch
from dflash_core.tuning.auto_dtype import (CACHE_FILE, choose_dtype, choose_training_dtype, default_cache_dir, model_key,
                                    probe_forward_costs, probe_training_costs, resolve_auto_dtype)
from tiny import tiny_target


def _costs(fp32: tuple[float, float], bf16: tuple[float, float], block: int = 16) -> dict:
    return {name: {"dtype": name, "one_token_s": one, "block_s": blk, "block_size": block}
            for name, (one, blk) in (("fp32", fp32), ("bf16", bf16))}


def _probe(costs: dict, calls: list):
    """A probe returning given timings (these tests are about the choice, not the clock)."""
    def probe(model, dtype, block_size):
        name = {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]
        calls.append(name)
        return costs[name]
    return probe


def _refuse(model, dtype, block_size):
    raise AssertionError("the probe ran although the choice was cached")


SLOW_BF16 = _costs(fp32=(0.010, 0.020), bf16=(0.012, 0.078))  # avx2-only: bf16 emulated
FAST_BF16 = _costs(fp32=(0.010, 0.020), bf16=(0.0062, 0.011))  # AMX / AVX512-BF16


def test_choice_follows_the_measurements_and_names_them():
    assert choose_dtype(SLOW_BF16, 16, machine="this CPU (X)") == (
        "fp32", "fp32: bf16 is 3.9x slower over 16 tokens (one token 1.20x) on this CPU (X)")
    assert choose_dtype(FAST_BF16, 16, machine="this CPU (X)") == (
        "bf16", "bf16: one token 0.62x and 16 tokens 0.55x the fp32 time on this CPU (X)")
    # faster, but not by the 10% margin on both shapes
    choice, reason = choose_dtype(_costs(fp32=(0.010, 0.020), bf16=(0.005, 0.019)), 16)
    assert choice == "fp32" and "0.50x" in reason and "0.95x" in reason


@pytest.mark.parametrize("costs, dtype", [(SLOW_BF16, torch.float32), (FAST_BF16, torch.bfloat16)])
def test_resolve_probes_once_then_uses_the_cache(tmp_path, costs, dtype):
    model, calls = tiny_target(), []
    chosen, reason = resolve_auto_dtype(model, 16, device="cpu", probe=_probe(costs, calls), cache_dir=tmp_path)
    # a bf16 verdict is confirmed by a second probe of both dtypes before it is trusted
    probes = 2 if dtype == torch.bfloat16 else 1
    assert chosen == dtype and sorted(calls) == ["bf16"] * probes + ["fp32"] * probes
    assert not reason.endswith("(cached)")
    entry, = json.loads((tmp_path / CACHE_FILE).read_text()).values()
    assert entry["choice"] == {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]
    assert entry["costs"] == costs and entry["reason"] == reason and entry["measured_at"]
    again = resolve_auto_dtype(model, 16, device="cpu", probe=_refuse, cache_dir=tmp_path)
    assert again == (dtype, reason + " (cached)")
    # another block size is another question: measured again, kept beside the first
    resolve_auto_dtype(model, 8, device="cpu", probe=_probe(costs, calls), cache_dir=tmp_path)
    assert len(calls) == 4 * probes and len(json.loads((tmp_path / CACHE_FILE).read_text())) == 2


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"k": 3}', ""])
def test_corrupt_cache_is_measured_again_and_overwritten(tmp_path, content):
    (tmp_path / CACHE_FILE).write_text(content)
    calls: list = []
    model = tiny_target()
    assert resolve_auto_dtype(model, 16, device="cpu", probe=_probe(SLOW_BF16, calls),
                              cache_dir=tmp_path)[0] == torch.float32
    assert len(calls) == 2
    assert resolve_auto_dtype(model, 16, device="cpu", probe=_refuse, cache_dir=tmp_path)[1].endswith("(cached)")
    assert [p.name for p in tmp_path.iterdir()] == [CACHE_FILE]  # no temp file left behind


def test_cache_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "a"
    monkeypatch.delenv("DFLASH_CACHE_DIR")
    assert default_cache_dir() == tmp_path / "xdg" / "dflash"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir().parts[-2:] == (".cache", "dflash")


def test_model_key_ignores_dtype_but_not_shape_or_block():
    key = model_key(tiny_target(), 16)
    assert key == model_key(tiny_target(dtype=torch.bfloat16), 16)
    assert key != model_key(tiny_target(), 8) and key != model_key(tiny_target(layers=2), 16)


def test_real_probe_times_both_shapes_and_leaves_the_model_alone():
    model = tiny_target(vocab=32, layers=2)
    costs = probe_forward_costs(model, torch.bfloat16, 4, context=8, repeats=1)
    assert costs["dtype"] == "bf16" and costs["block_size"] == 4
    assert costs["one_token_s"] > 0 and costs["block_s"] > 0
    assert next(model.parameters()).dtype == torch.float32


def _train_costs(fp32: float, bf16: float) -> dict:
    return {name: {"dtype": name, "train_s": seconds, "tokens": 512} for name, seconds in (("fp32", fp32), ("bf16", bf16))}


def test_training_choice_follows_the_training_sized_forward():
    assert choose_training_dtype(_train_costs(2.3, 1.6), machine="this CPU (X)") == (
        "bf16", "bf16 for batches: a 512-token forward takes 0.70x the fp32 time on this CPU (X)")
    assert choose_training_dtype(_train_costs(1.0, 3.5), machine="this CPU (X)") == (
        "fp32", "fp32 for batches: bf16 takes 3.50x the fp32 time over a 512-token forward on this CPU (X) "
        "(needs <= 0.9x)")
    assert choose_training_dtype(_train_costs(1.0, 0.95))[0] == "fp32"  # faster, but not by the 10% margin


def test_training_is_its_own_question_with_its_own_cache_entry(tmp_path):
    """The machine where this was found: decoding one token is faster in fp32, a training batch in bf16."""
    model, calls = tiny_target(), []
    decode, _ = resolve_auto_dtype(model, 16, device="cpu", probe=_probe(SLOW_BF16, calls), cache_dir=tmp_path)
    train, reason = resolve_auto_dtype(model, 16, device="cpu", probe=_probe(_train_costs(2.3, 1.6), calls),
                                       cache_dir=tmp_path, workload="train")
    assert (decode, train) == (torch.float32, torch.bfloat16) and reason.startswith("bf16 for batches:")
    assert sorted(calls) == ["bf16"] * 3 + ["fp32"] * 3  # decode once; train twice (a bf16 verdict is confirmed)
    keys = sorted(json.loads((tmp_path / CACHE_FILE).read_text()))
    assert len(keys) == 2
    (decode_key,) = [k for k in keys if k.endswith("|bf16=prepacked")]  # bf16 probed as decoding reads its weights
    (train_key,) = [k for k in keys if k != decode_key]
    assert train_key == decode_key.removesuffix("|bf16=prepacked") + "|workload=train"
    assert resolve_auto_dtype(model, 16, device="cpu", probe=_refuse, cache_dir=tmp_path,
                              workload="train") == (torch.bfloat16, reason + " (cached)")
    with pytest.raises(ValueError, match=r"workload 'serve' is not one of decode, train"):
        resolve_auto_dtype(model, 16, device="cpu", cache_dir=tmp_path, workload="serve")


def test_a_bf16_training_verdict_must_survive_a_second_probe(tmp_path):
    bf16_times = iter([0.5, 1.2])  # a lucky first bf16 probe, then the machine as it is

    def probe(model, dtype, block_size):
        seconds = 1.0 if dtype == torch.float32 else next(bf16_times)
        return {"dtype": "fp32" if dtype == torch.float32 else "bf16", "train_s": seconds, "tokens": 512}

    chosen, reason = resolve_auto_dtype(tiny_target(), 16, device="cpu", probe=probe, cache_dir=tmp_path,
                                        workload="train")
    assert chosen == torch.float32 and "1.20x" in reason  # each dtype's slower probe decides


def test_real_training_probe_times_one_batch_and_leaves_the_model_alone():
    model = tiny_target(vocab=32, layers=2)
    costs = probe_training_costs(model, torch.bfloat16, 4, shape=(2, 16), repeats=1)
    assert costs["dtype"] == "bf16" and costs["tokens"] == 32 and costs["train_s"] > 0
    assert next(model.parameters()).dtype == torch.float32
