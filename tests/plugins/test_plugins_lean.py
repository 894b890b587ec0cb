"""The engine plugins in the default environment (no sglang, no tensorrt installed)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging

import pytest
from tiny import drafter_config

from dflash_core.errors import CompatibilityError
from dflash_sglang.layout import check_capturable, launch_command, sglang_config
from dflash_trtllm.plan import ShapeLimits, build_plan, missing_requirements, profile_shapes


def test_sglang_entry_point_is_registered_and_imports_no_engine(caplog):
    points = [ep for ep in importlib.metadata.entry_points(group="sglang.srt.plugins") if ep.name == "dflash"]
    assert len(points) == 1 and points[0].value == "dflash_sglang.plugin:register"
    with caplog.at_level(logging.INFO, logger="dflash_sglang"):
        points[0].load()()  # SGLang calls it with no arguments, once per process
    assert "dflash-sglang plugin loaded" in caplog.text  # without sglang: loads, registers nothing
    if importlib.util.find_spec("sglang") is None:
        import sys

        assert "sglang" not in sys.modules


def test_sglang_config_and_command():
    cfg = drafter_config(hidden=32, target_layers=8, layers=2, block_size=16, layer_ids=(1, 5))
    raw = sglang_config(cfg, "bfloat16")
    assert raw["dflash_config"] == {"target_layer_ids": [1, 5], "mask_token_id": 63, "block_size": 16}
    assert raw["dtype"] == raw["torch_dtype"] == "bfloat16" and "is_causal" not in raw
    command = launch_command("/m/target", "/m/draft", cfg, tokenizer="/m/draft/tokenizer")
    assert command[:3] == ["python", "-m", "sglang.launch_server"]
    assert command[command.index("--speculative-num-draft-tokens") + 1] == "16"
    assert command[command.index("--speculative-algorithm") + 1] == "DFLASH"
    assert command[-2:] == ["--tokenizer-path", "/m/draft/tokenizer"]
    check_capturable(cfg, 8)
    with pytest.raises(CompatibilityError, match="last layer \\(5\\)"):
        check_capturable(cfg, 6)


def test_tensorrt_profile_shapes_are_consistent():
    cfg = drafter_config(hidden=32, target_layers=8, layers=2, block_size=16, layer_ids=(1, 5))
    shapes = profile_shapes(cfg, ShapeLimits(max_batch=4, max_context=1000, max_new_context=300))
    for which in range(3):  # min, opt, max are each one consistent set of shapes
        noise, hidden, pos = shapes["noise_embedding"][which], shapes["target_hidden"][which], shapes["position_ids"][which]
        key, valid = shapes["past_key"][which], shapes["context_valid"][which]
        assert noise[0] == hidden[0] == pos[0] == key[1] == valid[0]
        assert pos[1] == hidden[1] + noise[1] and valid[1] == key[3] + hidden[1]
        assert hidden[2] == cfg.fc_in_features and key[0] == 2 and key[4] == cfg.head_dim
    assert shapes["noise_embedding"][2] == (4, 16, 32) and shapes["past_key"][0][3] == 0


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="tensorrt is installed here")
def test_tensorrt_missing_is_named(tmp_path):
    assert "'tensorrt' is not installed" in missing_requirements()
    with pytest.raises(ImportError):
        build_plan(tmp_path / "x.onnx", tmp_path / "x.plan", drafter_config(), "fp16")


def test_preflight_checks_a_converted_directory(tmp_path):
    from dflash_convert.cli import main as convert
    from dflash_core.errors import CheckpointError
    from dflash_sglang.preflight import check_draft_dir
    from tiny import tiny_drafter

    tiny_drafter(drafter_config(hidden=32, target_layers=8, layers=1, block_size=8, layer_ids=(3,))).save_pretrained(
        tmp_path / "src")
    assert convert([str(tmp_path / "src"), "--to", "sglang", "--out", str(tmp_path / "sgl")]) == 0
    assert check_draft_dir(tmp_path / "sgl", 8) == []
    assert "trained with blocks of 8" in check_draft_dir(tmp_path / "sgl", 16)[0]
    weights = tmp_path / "sgl" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="model.safetensors changed since dflash-convert wrote it"):
        check_draft_dir(tmp_path / "sgl")
    (tmp_path / "sgl" / "launch.sh").unlink()
    with pytest.raises(CheckpointError, match=r"launch.sh is missing \(and 1 more\)"):
        check_draft_dir(tmp_path / "sgl")
