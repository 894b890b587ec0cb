"""dflash-convert: every target from random published-format checkpoints, and every kind of bad input."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file
from tiny import drafter_config, save_tiny_pair, tiny_drafter

from dflash_convert.cli import main
from dflash_core import load_drafter
from dflash_core.model.onnx_export import DrafterGraph, example_inputs
from dflash_trtllm.options import validate_options


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("convert")
    target, drafter = save_tiny_pair(root, block_size=8, drafter_layers=2)
    return target, drafter


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _same_weights(a: Path, b: Path, dtype=torch.bfloat16):
    x, y = load_drafter(a).state_dict(), load_drafter(b).state_dict()
    return x.keys() == y.keys() and all(torch.equal(x[k].to(dtype), y[k].to(dtype)) for k in x)


def _manifest_ok(out: Path):
    manifest = json.loads((out / "manifest.json").read_text())
    for name, digest in manifest["files"].items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest
    assert manifest["tool"] == "dflash-convert" and len(manifest["source"]["sha256"]) == 64
    return manifest


def test_sglang_directory(pair, tmp_path, capsys):
    target, drafter = pair
    out = tmp_path / "sgl"
    code, stdout, _ = run(capsys, drafter, "--to", "sglang", "--out", out, "--target-model", target)
    assert code == 0
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["block_size"] == 8 and config["dflash_config"]["block_size"] == 8
    assert config["dflash_config"]["target_layer_ids"] == [1, 2] and config["dtype"] == "bfloat16"
    for key in ("head_dim", "num_key_value_heads", "intermediate_size", "rms_norm_eps", "rope_theta"):
        assert key in config
    assert _same_weights(drafter, out)
    launch = (out / "launch.sh").read_text()
    expected = (f"python -m sglang.launch_server --model-path {target.resolve()} --speculative-algorithm DFLASH "
                f"--speculative-draft-model-path {out.resolve()} --speculative-num-draft-tokens 8 --dtype bfloat16")
    assert expected in launch and expected in stdout
    assert os.stat(out / "launch.sh").st_mode & stat.S_IXUSR
    assert _manifest_ok(out)["target"] == "sglang"


def test_sglang_sliding_layers_stay_bidirectional(tmp_path, capsys):
    cfg = drafter_config(hidden=32, target_layers=8, layers=2, block_size=4, layer_ids=(2, 5),
                         layer_types=("sliding_attention", "full_attention"), sliding_window=64)
    tiny_drafter(cfg).save_pretrained(tmp_path / "d")
    assert run(capsys, tmp_path / "d", "--to", "sglang", "--out", tmp_path / "o")[0] == 0
    config = json.loads((tmp_path / "o" / "config.json").read_text())
    assert config["is_causal"] is False and config["use_sliding_window"] is True and config["sliding_window"] == 64


def test_trtllm_options(pair, tmp_path, capsys):
    target, drafter = pair
    out = tmp_path / "trt"
    code, stdout, _ = run(capsys, drafter, "--to", "trtllm", "--out", out, "--target-model", target)
    assert code == 0
    options = yaml.safe_load((out / "dflash.yaml").read_text())
    validate_options(options, block_size=8)
    assert options["speculative_config"] == {"decoding_type": "DFlash", "max_draft_len": 7,
                                             "speculative_model": str(out.resolve()), "target_layer_ids": [1, 2],
                                             "mask_token_id": load_drafter(drafter).config.mask_token_id}
    assert options["max_num_tokens"] >= options["max_batch_size"] * 8
    assert f"trtllm-serve {target.resolve()} --backend pytorch" in stdout
    assert f"--extra_llm_api_options {out.resolve() / 'dflash.yaml'}" in stdout
    assert _same_weights(drafter, out)
    _manifest_ok(out)


def test_trtllm_option_checks():
    good = {"max_seq_len": 512, "max_batch_size": 2, "max_num_tokens": 64,
            "speculative_config": {"decoding_type": "DFlash", "max_draft_len": 15, "speculative_model": "/d"}}
    validate_options(good, block_size=16)
    from dflash_core.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown key 'draft_len'"):
        validate_options({**good, "speculative_config": {**good["speculative_config"], "draft_len": 3}})
    with pytest.raises(ConfigError, match="at most block_size - 1 = 7"):
        validate_options(good, block_size=8)
    with pytest.raises(ConfigError, match="expected 'DFlash'"):
        validate_options({**good, "speculative_config": {**good["speculative_config"], "decoding_type": "Eagle3"}})


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_onnx_parity(pair, tmp_path, capsys, dtype):
    target, drafter = pair
    out = tmp_path / f"onnx-{dtype}"
    code, stdout, _ = run(capsys, drafter, "--to", "onnx", "--out", out, "--dtype", dtype)
    assert code == 0
    parity = json.loads((out / "parity.json").read_text())
    # both precisions run on ONNX Runtime's CPU provider (only bf16 does not: numpy has no bfloat16)
    assert parity["runnable"], parity.get("reason")
    assert "max abs diff vs torch fp32" in stdout
    assert parity["max_abs_diff"] <= (1e-4 if dtype == "fp32" else 2e-2)
    # independent check at shapes the converter did not use
    session = ort.InferenceSession(str(out / "drafter.onnx"), providers=["CPUExecutionProvider"])
    reference = DrafterGraph(load_drafter(drafter).float()).eval()
    for batch, new, block, past in [(4, 2, 8, 30), (1, 50, 16, 0), (2, 1, 3, 100)]:
        inputs = example_inputs(reference.drafter, torch.float32, batch, new, block, past, seed=batch)
        feeds = {i.name: (x.half() if dtype == "fp16" and x.is_floating_point() else x).numpy()
                 for i, x in zip(session.get_inputs(), inputs)}
        got = session.run(None, feeds)
        with torch.no_grad():
            want = reference(*inputs)
        diff = max(float(np.abs(g.astype(np.float32) - w.numpy()).max()) for g, w in zip(got, want))
        assert diff <= (1e-4 if dtype == "fp32" else 5e-2)
        assert got[1].shape[3] == past + new  # present K/V = past + new context


def test_onnx_with_lm_head(pair, tmp_path, capsys):
    target, drafter = pair
    out = tmp_path / "head"
    assert run(capsys, drafter, "--to", "onnx", "--out", out, "--with-lm-head", "--target-model", target)[0] == 0
    session = ort.InferenceSession(str(out / "drafter.onnx"), providers=["CPUExecutionProvider"])
    assert session.get_outputs()[0].name == "logits"
    head = load_file(str(target / "model.safetensors"))["lm_head.weight"]
    d = load_drafter(drafter).float()
    inputs = example_inputs(d, torch.float32, 2, 3, 8, 5)
    logits = session.run(None, {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs)})[0]
    with torch.no_grad():
        want = DrafterGraph(d)(*inputs)[0] @ head.float().T
    assert logits.shape[-1] == head.shape[0] and np.abs(logits - want.numpy()).max() <= 1e-4
    code, _, err = run(capsys, drafter, "--to", "onnx", "--out", tmp_path / "x", "--with-lm-head")
    assert code == 2 and "needs --target-model" in err


def test_tensorrt_without_tensorrt_exits_3(pair, tmp_path, capsys):
    _, drafter = pair
    code, _, err = run(capsys, drafter, "--to", "tensorrt", "--out", tmp_path / "plan")
    assert code == 3 and "tensorrt" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "plan").exists() and list(tmp_path.iterdir()) == []


def test_dry_run_writes_nothing(pair, tmp_path, capsys):
    target, drafter = pair
    for to in ("sglang", "trtllm", "onnx"):
        code, stdout, _ = run(capsys, drafter, "--to", to, "--out", tmp_path / to, "--dry-run", "--target-model", target)
        assert code == 0 and "plan:" in stdout and "nothing is written" in stdout
    assert list(tmp_path.iterdir()) == []


def test_existing_output_needs_force(pair, tmp_path, capsys):
    _, drafter = pair
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, _, err = run(capsys, drafter, "--to", "trtllm", "--out", out)
    assert code == 2 and "already holds other files; pass --force" in err and (out / "keep.txt").exists()
    assert run(capsys, drafter, "--to", "trtllm", "--out", out, "--force")[0] == 0
    assert not (out / "keep.txt").exists() and (out / "dflash.yaml").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["o"]  # no .old-* or .tmp sibling left


def test_sharded_and_training_sources(pair, tmp_path, capsys):
    _, drafter = pair
    d = load_drafter(drafter)
    d.save_pretrained(tmp_path / "sharded", max_shard_bytes=30_000)
    assert run(capsys, tmp_path / "sharded" / "model.safetensors.index.json", "--to", "sglang",
               "--out", tmp_path / "a")[0] == 0
    assert _same_weights(drafter, tmp_path / "a")
    # a `dflash train` state directory (fp32 master weights + state.json)
    from dflash_core.training.train_state import save_training_state

    optimizer = torch.optim.AdamW(d.float().parameters())
    save_training_state(tmp_path / "run" / "train_state", d.state_dict(), optimizer,
                        {"step": 1, "drafter": d.config.to_dict()})
    code, _, err = run(capsys, tmp_path / "run" / "train_state", "--to", "trtllm", "--out", tmp_path / "b")
    assert code == 0, err
    assert json.loads((tmp_path / "b" / "manifest.json").read_text())["source"]["kind"] == "training state"
    assert _same_weights(drafter, tmp_path / "b")


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _broken(drafter: Path, tmp: Path, kind: str) -> Path:
    d = _copy(drafter, tmp / kind)
    weights = d / "model.safetensors"
    if kind == "missing-tensor":
        t = load_file(str(weights)); t.pop("layers.1.mlp.down_proj.weight"); save_file(t, str(weights))
    elif kind == "wrong-shape":
        t = load_file(str(weights)); t["norm.weight"] = torch.ones(7); save_file(t, str(weights))
    elif kind == "corrupt-header":
        data = bytearray(weights.read_bytes()); data[10:30] = b"}" * 20; weights.write_bytes(bytes(data))
    elif kind == "truncated":
        weights.write_bytes(weights.read_bytes()[:-100])
    elif kind == "unknown-architecture":
        c = json.loads((d / "config.json").read_text()); c["architectures"] = ["EagleModel"]
        (d / "config.json").write_text(json.dumps(c))
    return d


@pytest.mark.parametrize("kind,pattern", [
    ("missing-tensor", "missing tensor 'layers.1.mlp.down_proj.weight'"),
    ("wrong-shape", r"tensor 'norm.weight' has shape \[7\], expected \[32\]"),
    ("corrupt-header", "model.safetensors has a corrupt safetensors header"),
    ("truncated", "model.safetensors is truncated"),
    ("unknown-architecture", "unknown architecture \\['EagleModel'\\]"),
])
def test_bad_sources(pair, tmp_path, capsys, kind, pattern):
    import re

    _, drafter = pair
    src = _broken(drafter, tmp_path, kind)
    out_parent = tmp_path / "outs"
    out_parent.mkdir()
    code, _, err = run(capsys, src, "--to", "sglang", "--out", out_parent / "o")
    assert code == 2 and re.search(pattern, err), err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert list(out_parent.iterdir()) == []  # no output, no temporary leftovers


def test_incompatible_target(pair, tmp_path, capsys):
    target, _ = pair
    other = tmp_path / "d"
    tiny_drafter(drafter_config(hidden=48, heads=4, target_layers=4, vocab=300)).save_pretrained(other)
    code, _, err = run(capsys, other, "--to", "sglang", "--out", tmp_path / "o", "--target-model", target)
    assert code == 2 and "hidden_size is 48 but the target's is 32" in err and not (tmp_path / "o").exists()


def test_last_target_layer_is_refused_for_sglang(pair, tmp_path, capsys):
    target, _ = pair
    d = tmp_path / "d"
    tiny_drafter(drafter_config(hidden=32, target_layers=4, vocab=300, layer_ids=(1, 3), mask_token_id=1)).save_pretrained(d)
    code, _, err = run(capsys, d, "--to", "sglang", "--out", tmp_path / "o", "--target-model", target)
    assert code == 2 and "SGLang cannot capture" in err


def test_tokenizer_gets_the_mask_token(tmp_path, capsys):
    """A target whose tokenizer lacks <|MASK|>: the converter adds it and points the launcher at it."""
    from tiny import tiny_target
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>"] + [f"w{i}" for i in range(40)]
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(
        {w: i for i, w in enumerate(words)}, unk_token="<unk>")), unk_token="<unk>")
    model = tiny_target(vocab=48)
    model.save_pretrained(tmp_path / "t")
    tokenizer.save_pretrained(tmp_path / "t")
    tiny_drafter(drafter_config(model, block_size=4, mask_token_id=41)).save_pretrained(tmp_path / "d")
    code, stdout, err = run(capsys, tmp_path / "d", "--to", "sglang", "--out", tmp_path / "o",
                            "--target-model", tmp_path / "t")
    assert code == 0 and "added <|MASK|> as id 41" in err
    saved = PreTrainedTokenizerFast.from_pretrained(tmp_path / "o" / "tokenizer")
    assert saved.convert_tokens_to_ids("<|MASK|>") == 41
    assert f"--tokenizer-path {(tmp_path / 'o' / 'tokenizer').resolve()}" in stdout


def test_console_script(pair, tmp_path):
    _, drafter = pair
    exe = Path(sys.executable).parent / "dflash-convert"
    done = subprocess.run([str(exe), str(drafter), "--to", "trtllm", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and (tmp_path / "o" / "dflash.yaml").exists()
    bad = subprocess.run([str(exe), str(tmp_path / "nothing"), "--to", "onnx", "--out", str(tmp_path / "p")],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "does not exist" in bad.stderr and "Traceback" not in bad.stderr


def test_outputs_carry_no_remote_code_keys(tmp_path, capsys):
    """auto_map / trust_remote_code in the source config or the target's tokenizer never reach an output."""
    from tiny import tiny_target
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>"] + [f"w{i}" for i in range(40)]
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(
        {w: i for i, w in enumerate(words)}, unk_token="<unk>")), unk_token="<unk>")
    tiny_target(vocab=48).save_pretrained(tmp_path / "t")
    tokenizer.save_pretrained(tmp_path / "t")
    tiny_drafter(drafter_config(vocab=48, block_size=4, mask_token_id=41)).save_pretrained(tmp_path / "d")
    remote = {"auto_map": {"AutoModel": "modeling_dflash.DFlashDraftModel"}, "trust_remote_code": True}
    settings = json.loads((tmp_path / "t" / "tokenizer_config.json").read_text())
    (tmp_path / "t" / "tokenizer_config.json").write_text(json.dumps({**settings, **remote}))
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    config["dflash_config"].update(remote)  # nested keys go too
    (tmp_path / "d" / "config.json").write_text(json.dumps({**config, **remote}))
    source_config = (tmp_path / "d" / "config.json").read_text()
    for to in ("sglang", "trtllm"):
        out = tmp_path / to
        code, _, err = run(capsys, tmp_path / "d", "--to", to, "--out", out, "--target-model", tmp_path / "t")
        assert code == 0, err
        assert (out / "tokenizer" / "tokenizer_config.json").is_file()
        for file in [*out.rglob("*.json"), *out.rglob("*.yaml")]:
            assert "auto_map" not in file.read_text() and "trust_remote_code" not in file.read_text(), file
    assert (tmp_path / "d" / "config.json").read_text() == source_config
