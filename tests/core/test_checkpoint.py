"""Drafter checkpoints: exact round trip, shards, and a one-line error for every kind of bad file."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from dflash_core import CheckpointError, ConfigError, load_drafter
from safetensors.torch import save_file
from tiny import drafter_config, tiny_drafter


@pytest.fixture
def saved(tmp_path):
    cfg = drafter_config(hidden=32, target_layers=8, layers=2, block_size=8, layer_ids=(2, 5))
    drafter = tiny_drafter(cfg, seed=11)
    drafter.save_pretrained(tmp_path / "d")
    return drafter, tmp_path / "d"


def _same(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_load_save_load_is_exact(saved, tmp_path):
    drafter, path = saved
    loaded = load_drafter(path)
    assert loaded.config == drafter.config and _same(loaded, drafter)
    loaded.save_pretrained(tmp_path / "again")
    again = load_drafter(tmp_path / "again")
    assert again.config == drafter.config and _same(again, drafter)
    assert (path / "model.safetensors").read_bytes() == (tmp_path / "again" / "model.safetensors").read_bytes()


def test_sharded_checkpoint(saved, tmp_path):
    drafter, _ = saved
    drafter.save_pretrained(tmp_path / "sharded", max_shard_bytes=20_000)
    files = sorted(p.name for p in (tmp_path / "sharded").iterdir())
    assert "model.safetensors.index.json" in files and len([f for f in files if f.startswith("model-")]) > 2
    assert _same(load_drafter(tmp_path / "sharded"), drafter)


def test_dtype_on_load_and_save(saved, tmp_path):
    drafter, path = saved
    bf16 = load_drafter(path, dtype="bf16")
    assert bf16.dtype == torch.bfloat16 and bf16.config.dtype == "float32"
    bf16.save_pretrained(tmp_path / "bf16")
    again = load_drafter(tmp_path / "bf16")
    assert again.dtype == torch.bfloat16 and again.config.dtype == "bfloat16"


def test_model_prefix_is_accepted(saved, tmp_path):
    drafter, path = saved
    (tmp_path / "pref").mkdir()
    (tmp_path / "pref" / "config.json").write_text((path / "config.json").read_text())
    save_file({"model." + k: v.contiguous() for k, v in drafter.state_dict().items()},
              str(tmp_path / "pref" / "model.safetensors"))
    assert _same(load_drafter(tmp_path / "pref"), drafter)


def _rewrite(path, mutate):
    tensors = {k: v.contiguous() for k, v in load_drafter(path).state_dict().items()}
    mutate(tensors)
    save_file(tensors, str(path / "model.safetensors"))


def _one_line(exc_info):
    assert "\n" not in str(exc_info.value)
    return str(exc_info.value)


def test_missing_tensor(saved):
    _, path = saved
    _rewrite(path, lambda t: t.pop("layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensor 'layers.1.mlp.up_proj.weight' \(expected shape \[64, 32\]\)") as e:
        load_drafter(path)
    _one_line(e)


def test_wrong_shape(saved):
    _, path = saved
    _rewrite(path, lambda t: t.update({"fc.weight": torch.zeros(32, 96)}))
    with pytest.raises(CheckpointError, match=r"'fc.weight' has shape \[32, 96\], expected \[32, 64\]") as e:
        load_drafter(path)
    assert "2 target layers" in _one_line(e)


def test_unexpected_tensor(saved):
    _, path = saved
    _rewrite(path, lambda t: t.update({"lm_head.weight": torch.zeros(64, 32)}))
    with pytest.raises(CheckpointError, match="unexpected tensor 'lm_head.weight'"):
        load_drafter(path)


def test_corrupt_header(saved):
    _, path = saved
    file = path / "model.safetensors"
    data = bytearray(file.read_bytes())
    data[8:20] = b"@@@@@@@@@@@@"
    file.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt safetensors header") as e:
        load_drafter(path)
    assert str(file) in _one_line(e)


def test_header_length_beyond_file(saved):
    _, path = saved
    file = path / "model.safetensors"
    data = bytearray(file.read_bytes())
    data[:8] = struct.pack("<Q", 10**9)
    file.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt safetensors header: it declares 1000000000 header bytes"):
        load_drafter(path)


def test_truncated_file(saved):
    _, path = saved
    file = path / "model.safetensors"
    file.write_bytes(file.read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match="is truncated: tensor") as e:
        load_drafter(path)
    assert str(file) in _one_line(e)


def test_tiny_file(saved):
    _, path = saved
    (path / "model.safetensors").write_bytes(b"abc")
    with pytest.raises(CheckpointError, match="truncated: 3 bytes"):
        load_drafter(path)


def test_pickle_only_directory_is_refused(saved):
    _, path = saved
    (path / "model.safetensors").unlink()
    (path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(CheckpointError, match="only pickle weights"):
        load_drafter(path)


def test_missing_shard(saved, tmp_path):
    drafter, _ = saved
    drafter.save_pretrained(tmp_path / "sh", max_shard_bytes=20_000)
    index = json.loads((tmp_path / "sh" / "model.safetensors.index.json").read_text())
    victim = sorted(set(index["weight_map"].values()))[1]
    (tmp_path / "sh" / victim).unlink()
    with pytest.raises(CheckpointError, match=f"lists shard '{victim}', which does not exist"):
        load_drafter(tmp_path / "sh")


def test_missing_directory_and_config(tmp_path):
    with pytest.raises(CheckpointError, match="is not a directory"):
        load_drafter(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="config.json"):
        load_drafter(tmp_path / "empty")


def test_fc_width_must_match_layer_ids(saved, tmp_path):
    """A config whose target_layer_ids disagree with fc's width is refused at load."""
    _, path = saved
    raw = json.loads((path / "config.json").read_text())
    raw["dflash_config"]["target_layer_ids"] = [1, 2, 3]
    (path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=r"'fc.weight' has shape \[32, 64\], expected \[32, 96\]"):
        load_drafter(path)
