"""dflash_vllm in the default environment (no vllm installed): entry point, env list, layout, checks, conversion."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import os
import stat
import sys

import pytest
from safetensors.torch import load_file
from tiny import drafter_config, save_tiny_pair, tiny_drafter

from dflash_core.errors import CheckpointError, CompatibilityError
from dflash_vllm.environment import EXCLUDED, runtime_requirements
from dflash_vllm.layout import (CPU_KV_CACHE_BYTES, cpu_server_args, cpu_threads_env, launch_command, speculative_config,
                                vllm_config)
from dflash_vllm.preflight import check_draft_dir, check_pair, pair_problems


def test_entry_point_is_registered_and_imports_no_engine(caplog):
    points = [ep for ep in importlib.metadata.entry_points(group="vllm.general_plugins") if ep.name == "dflash"]
    assert len(points) == 1 and points[0].value == "dflash_vllm.plugin:register"
    with caplog.at_level(logging.INFO, logger="dflash_vllm"):
        points[0].load()()  # vLLM calls it with no arguments, in every process
    assert "dflash-vllm plugin loaded" in caplog.text
    if importlib.util.find_spec("vllm") is None:
        assert "vllm" not in sys.modules


def test_the_environment_list_keeps_vision_and_audio_out_and_pins_the_installed_torch():
    requires = ["regex", "torch==2.13.0+cpu; platform_machine == \"x86_64\"", "torchaudio; platform_machine != \"s390x\"",
                "TorchVision>=0.1", "torchcodec>=0.14", "pandas; extra == \"bench\"",
                "protobuf==7.36.1; platform_machine == \"s390x\"", "fastapi[standard]<0.137.0,>=0.133.0"]
    holds = {'platform_machine == "x86_64"': True, 'platform_machine != "s390x"': True,
             'platform_machine == "s390x"': False}
    kept = runtime_requirements(requires, holds.__getitem__, "torch==2.13.0+cpu")
    assert kept == ["regex", "torch==2.13.0+cpu", "fastapi[standard]<0.137.0,>=0.133.0"]
    assert EXCLUDED == {"torchvision", "torchaudio", "torchcodec"}


def test_speculative_config_and_command_name_the_method_and_block_minus_one():
    cfg = drafter_config(hidden=32, target_layers=8, layers=2, block_size=16, layer_ids=(1, 7))
    assert speculative_config("/m/draft", cfg) == {"method": "dflash", "model": "/m/draft", "num_speculative_tokens": 15,
                                                   "draft_sample_method": "probabilistic"}
    command = launch_command("/m/target", "/m/draft", cfg, dtype="fp32", port=8100, tokenizer="/m/draft/tokenizer")
    assert command[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert json.loads(command[command.index("--speculative-config") + 1])["num_speculative_tokens"] == 15
    assert command[command.index("--dtype") + 1] == "float32" and command[-2:] == ["--tokenizer", "/m/draft/tokenizer"]
    sliding = drafter_config(layers=2, layer_types=["sliding_attention"] * 2, sliding_window=64)
    assert vllm_config(sliding, "bf16")["is_causal"] is False and "is_causal" not in vllm_config(cfg, "bf16")


def test_a_draft_length_schedules_k_for_every_batch_size_and_keeps_the_whole_block():
    cfg = drafter_config(hidden=32, target_layers=8, layers=2, block_size=16, layer_ids=(1, 7))
    spec = speculative_config("/m/draft", cfg, draft_length=3)
    assert spec["num_speculative_tokens"] == 15  # vLLM reserves (and the plugin drafts) the whole block
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 1 << 16, 3]]
    assert speculative_config("/m/draft", cfg, draft_length=15) == speculative_config("/m/draft", cfg)
    for bad in (0, 16):
        with pytest.raises(ValueError, match="expected 1..15"):
            speculative_config("/m/draft", cfg, draft_length=bad)
    command = launch_command("/m/target", "/m/draft", cfg, draft_length=5)
    assert json.loads(command[command.index("--speculative-config") + 1])["num_speculative_tokens_per_batch_size"] == [
        [1, 1 << 16, 5]]


def test_a_cpu_of_few_cores_gives_the_model_every_core_and_keeps_what_the_caller_set():
    assert cpu_threads_env([0, 1], {}) == {"VLLM_CPU_OMP_THREADS_BIND": "0,1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
                                         "OMP_WAIT_POLICY": "PASSIVE"}
    assert cpu_threads_env([5, 3, 4], {})["VLLM_CPU_OMP_THREADS_BIND"] == "3,4,5"  # the cores this process may use
    kept = cpu_threads_env([0, 1], {"OMP_WAIT_POLICY": "ACTIVE", "VLLM_CPU_OMP_THREADS_BIND": "auto"})
    assert kept == {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    assert cpu_threads_env(list(range(4)), {}) == {} == cpu_threads_env(list(range(64)), {})  # vLLM's own binding


def test_a_cpu_launch_holds_the_kv_cache_of_one_request_of_the_models_full_length():
    # Qwen2.5-Coder-1.5B: 28 layers, 2 KV heads of 128, 32,768 positions; vLLM refused 1 GiB ("1.81 GiB KV cache
    # is needed" with one draft layer, fp32)
    coder = {"num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2, "hidden_size": 1536,
             "max_position_embeddings": 32768}
    size = int(cpu_server_args(coder, 1, "fp32")[-1])
    assert 1.81 * 2**30 < size < 1.05 * 1.82 * 2**30 and size % 2**20 == 0
    assert int(cpu_server_args(coder, 0, "bf16")[-1]) < size / 1.9  # half the bytes, one layer fewer
    demo = {"num_hidden_layers": 6, "num_attention_heads": 6, "num_key_value_heads": 2, "hidden_size": 384,
            "head_dim": 64, "max_position_embeddings": 2048}
    assert cpu_server_args(demo, 1, "fp32") == ["--enforce-eager", "--kv-cache-memory-bytes", str(CPU_KV_CACHE_BYTES)]


def test_pair_problems_are_one_line_each_and_the_last_layer_is_allowed():
    cfg = drafter_config(hidden=32, target_layers=8, layers=2, block_size=16, layer_ids=(1, 7))
    target = {"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 8, "hidden_size": 32, "vocab_size": 64}
    assert pair_problems(cfg, target, eagle3_target=True, device="cpu", triton=False) == []  # vLLM captures layer 7
    problems = pair_problems(cfg, {**target, "num_hidden_layers": 6, "hidden_size": 48, "vocab_size": 32},
                             eagle3_target=False, device="cpu", triton=False)
    assert len(problems) == 4 and all("\n" not in p for p in problems)
    assert "EAGLE-3 interface" in problems[0] and "[7]" in problems[1] and "48" in problems[2]
    mixed = drafter_config(layers=2, layer_types=["sliding_attention", "full_attention"], sliding_window=64)
    target4 = {**target, "num_hidden_layers": 4}
    assert "V2" in pair_problems(mixed, target4, eagle3_target=True, device="cpu", triton=False)[0]
    assert pair_problems(mixed, target4, eagle3_target=True, device="cuda", triton=True) == []


def test_dflash_convert_to_vllm_round_trip_and_its_checks(tmp_path, capsys):
    from dflash_convert.cli import main as convert

    target, drafter = save_tiny_pair(tmp_path, block_size=8, drafter_layers=2)
    out = tmp_path / "vllm"
    assert convert([str(drafter), "--to", "vllm", "--out", str(out), "--target-model", str(target)]) == 0
    stdout = capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["dtype"] == "bfloat16"
    assert json.loads((out / "speculative_config.json").read_text()) == {
        "method": "dflash", "model": str(out.resolve()), "num_speculative_tokens": 7,
        "draft_sample_method": "probabilistic"}
    source, written = load_file(str(drafter / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert source.keys() == written.keys()
    assert all((source[k].bfloat16() == written[k]).all() for k in source)
    launch = (out / "launch.sh").read_text()
    assert "-m vllm.entrypoints.openai.api_server --model" in launch and '"num_speculative_tokens": 7' in launch
    assert "vllm.entrypoints.openai.api_server" in stdout and os.stat(out / "launch.sh").st_mode & stat.S_IXUSR
    assert check_pair(out, target, eagle3_target=True, device="cpu", triton=False).block_size == 8
    weights = out / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="model.safetensors changed since dflash-convert wrote it"):
        check_draft_dir(out)
    with pytest.raises(CompatibilityError, match="does not implement vLLM's EAGLE-3"):
        check_pair(drafter, target, eagle3_target=False, device="cpu", triton=False)


def test_a_tiny_drafter_saved_by_the_core_is_read(tmp_path):
    tiny_drafter(drafter_config(hidden=32, target_layers=8, layers=1, block_size=8, layer_ids=(3,))).save_pretrained(
        tmp_path / "d")
    assert check_draft_dir(tmp_path / "d").target_layer_ids == (3,)
