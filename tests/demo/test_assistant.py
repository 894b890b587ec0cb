"""The assistant of the `assisted` peer method: built by the demo builder, shares the target's vocabulary,
and Hugging Face assisted generation with it is the target's own greedy output, token for token."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from dflash_core.errors import ConfigError
from dflash_demo import assistant as assistant_mod
from dflash_demo.assistant import SIZE_BUDGET_BYTES, AssistantRecipe, build_assistant
from dflash_demo.corpus import CorpusSplit
from dflash_demo.target_lm import build_model
from tiny import save_tiny_pair
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

DEMO = Path(__file__).resolve().parents[2] / "models" / "demo"
TINY = AssistantRecipe(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32,
                       max_positions=512, seq_len=32, batch_size=2, steps=3, warmup_steps=1, checkpoint_every=2)


def small_split() -> CorpusSplit:
    """A few of the builder's own files stand in for the standard library."""
    root = Path(assistant_mod.__file__).parent
    return CorpusSplit(root=root, train=("build.py", "target_lm.py", "session.py"), heldout=("corpus.py",))


@pytest.fixture(scope="module")
def tiny_built(tmp_path_factory):
    root = tmp_path_factory.mktemp("assistant")
    save_tiny_pair(root / "models")
    path = build_assistant(root / "work", root / "models", TINY, split=small_split())
    return root, path


def test_tiny_assistant_is_loadable_and_shares_the_vocabulary(tiny_built):
    root, path = tiny_built
    assert path == root / "models" / "assistant"
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= {
        f.name for f in path.iterdir()}
    assistant = AutoModelForCausalLM.from_pretrained(path)
    target = AutoModelForCausalLM.from_pretrained(root / "models" / "target")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
    assert assistant.config.vocab_size == target.config.vocab_size == len(tokenizer)
    assert tokenizer.get_vocab() == PreTrainedTokenizerFast.from_pretrained(root / "models" / "target").get_vocab()
    assert (root / "work" / "assistant_state").is_dir()  # resumable


def test_assisted_generation_equals_target_greedy(tiny_built):
    root, path = tiny_built
    target = AutoModelForCausalLM.from_pretrained(root / "models" / "target", dtype=torch.float32).eval()
    assistant = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
    for prompt in ("def tiny_target(arch", "    config = config_cls(\n"):
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        plain = target.generate(ids, do_sample=False, max_new_tokens=24)
        assisted = target.generate(ids, assistant_model=assistant, do_sample=False, max_new_tokens=24)
        assert torch.equal(plain, assisted), (plain, assisted)


def test_a_target_whose_tokenizer_and_vocabulary_differ_is_refused(tmp_path):
    target_dir, _ = save_tiny_pair(tmp_path / "models")
    config = json.loads((target_dir / "config.json").read_text())
    config["vocab_size"] += 1
    (target_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="vocab_size"):
        build_assistant(tmp_path / "work", tmp_path / "models", TINY, split=small_split())


@pytest.mark.skipif(not (DEMO / "target" / "config.json").is_file(), reason="no demo target")
def test_default_recipe_fits_the_size_budget():
    tokenizer = PreTrainedTokenizerFast.from_pretrained(DEMO / "target")
    params = sum(p.numel() for p in build_model(AssistantRecipe(), tokenizer).parameters())
    names = ("tokenizer.json", "tokenizer_config.json")
    tokenizer_bytes = sum((DEMO / "target" / name).stat().st_size for name in names)
    assert 2 * params + tokenizer_bytes + 20_000 <= SIZE_BUDGET_BYTES  # bf16 weights, tokenizer, configs


@pytest.mark.skipif(not (DEMO / "assistant" / "config.json").is_file(), reason="no demo assistant built")
def test_the_committed_assistant_matches_the_demo_target():
    assistant = json.loads((DEMO / "assistant" / "config.json").read_text())
    target = json.loads((DEMO / "target" / "config.json").read_text())
    for key in ("vocab_size", "max_position_embeddings", "eos_token_id", "pad_token_id"):
        assert assistant[key] == target[key], key
    assert sum(f.stat().st_size for f in (DEMO / "assistant").iterdir()) <= SIZE_BUDGET_BYTES
    vocab = PreTrainedTokenizerFast.from_pretrained(DEMO / "assistant").get_vocab()
    assert vocab == PreTrainedTokenizerFast.from_pretrained(DEMO / "target").get_vocab()
