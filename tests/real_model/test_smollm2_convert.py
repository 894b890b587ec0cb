"""`make real-model`: the converted SmolLM2 target is a plain Hugging Face model, copied from its cache, and
the converter never overwrites a directory it did not make."""

from __future__ import annotations

import json

import pytest
import torch

from smollm2 import require_target


def _record():
    from dflash_demo.smollm2 import _source_record, find_gguf

    return _source_record(find_gguf(), torch.bfloat16)


def test_target_is_a_plain_llama_with_its_chat_template_and_its_source():
    path = require_target()
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert config["tie_word_embeddings"] and config["num_hidden_layers"] == 30 and config["vocab_size"] == 49152
    assert json.loads((path / "dflash_source.json").read_text()) == _record()  # made from the installed GGUF
    assert "<|im_start|>" in (path / "chat_template.jinja").read_text()


def test_install_copies_a_fresh_cache_then_finds_it_present(tmp_path):
    from dflash_demo.smollm2 import install

    cache = require_target()  # a fresh conversion serves as the cache: nothing is converted here
    out = tmp_path / "target"
    assert install(out, cache, torch.bfloat16) == "copied"
    assert install(out, cache, torch.bfloat16) == "present"
    assert (out / "model.safetensors").stat().st_size == (cache / "model.safetensors").stat().st_size


@pytest.mark.parametrize("where", ["out", "cache"])
def test_foreign_directories_are_refused_and_kept(tmp_path, where):
    from dflash_core.errors import OutputError
    from dflash_demo.smollm2 import install

    require_target()
    foreign = tmp_path / "someone"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    out, cache = (foreign, tmp_path / "cache") if where == "out" else (tmp_path / "out", foreign)
    with pytest.raises(OutputError, match="holds something other than a converted SmolLM2 target"):
        install(out, cache, torch.bfloat16)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"] and not (tmp_path / "out").exists()
