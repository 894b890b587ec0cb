"""The assistant: a small autoregressive draft model for the `assisted` peer method.

Hugging Face assisted generation (`target.generate(..., assistant_model=assistant)`) drafts with a
second causal LM that shares the target's tokenizer. This one is trained like the target (same
corpus split, same training loop, resumable), with the target's own tokenizer, at a size whose
bf16 weights stay under 4 MB.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from dflash_core.errors import ConfigError
from .build import token_stream
from .corpus import CorpusSplit, split_corpus
from .target_lm import TargetRecipe, heldout_loss, train_target_lm

SIZE_BUDGET_BYTES = 4_000_000  # the whole models/demo/assistant folder, tokenizer files included


@dataclass(frozen=True)
class AssistantRecipe(TargetRecipe):
    """Shape and schedule of the assistant: the target's recipe with these changes.

    1.44M parameters, 1.05M of them the tied 8192 x 128 embedding; 2.9 MB in bf16. About 1.6 s a
    step on one thread of the 2-core CPU, so the default schedule takes ~16 minutes there.
    """

    hidden_size: int = 128  # head_dim = hidden_size // num_heads = 32
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    batch_size: int = 8  # 8 x 512 tokens a step, as the target
    steps: int = 600  # 2.5M training tokens
    peak_lr: float = 3e-3  # a small model takes a larger step than the target's 1e-3
    warmup_steps: int = 50
    eval_every: int = 100
    checkpoint_every: int = 50
    autocast_bf16: bool = False  # fp32: bf16 autocast is ~6x slower on an AVX2-only CPU, and the model is tiny

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ConfigError(f"assistant shape: hidden_size ({self.hidden_size}) must divide into num_heads "
                              f"({self.num_heads}), which must divide into num_kv_heads ({self.num_kv_heads}).")


def target_tokenizer(target_dir: Path) -> PreTrainedTokenizerFast:
    """The target's own tokenizer, checked against the target's vocabulary (assisted generation needs both equal)."""
    config = json.loads((target_dir / "config.json").read_text())
    tokenizer = PreTrainedTokenizerFast.from_pretrained(target_dir)
    if len(tokenizer) != config["vocab_size"]:
        raise ConfigError(f"{target_dir}: the tokenizer has {len(tokenizer)} entries but the target's vocab_size "
                          f"is {config['vocab_size']}; the assistant needs them equal.")
    return tokenizer


def _check_shared_tokenizer(tokenizer: PreTrainedTokenizerFast, work: Path) -> None:
    """The token streams in `work` are shared with the target stage: they must come from this tokenizer."""
    saved = work / "tokenizer"
    if not (saved / "tokenizer.json").is_file():
        tokenizer.save_pretrained(saved)  # the target stage then reuses it instead of training another
    elif PreTrainedTokenizerFast.from_pretrained(saved).get_vocab() != tokenizer.get_vocab():
        raise ConfigError(f"{saved} is not the target's tokenizer, so the token streams in {work} may not be "
                          f"either; remove {work}/tokenizer and {work}/*_tokens.npy to rebuild them.")


def build_assistant(work: Path, out: Path, recipe: AssistantRecipe = AssistantRecipe(),
                    split: CorpusSplit | None = None) -> Path:
    """Train (or resume, from `work/assistant_state`) the assistant for `out/target`; write `out/assistant`."""
    target_dir = out / "target"
    tokenizer = target_tokenizer(target_dir)
    max_positions = json.loads((target_dir / "config.json").read_text())["max_position_embeddings"]
    if recipe.max_positions != max_positions:
        raise ConfigError(f"assistant recipe: max_positions is {recipe.max_positions}, expected the target's "
                          f"{max_positions}.")
    split = split or split_corpus()
    work.mkdir(parents=True, exist_ok=True)
    _check_shared_tokenizer(tokenizer, work)
    train = token_stream(tokenizer, split, split.train, work / "train_tokens.npy")
    heldout = token_stream(tokenizer, split, split.heldout, work / "heldout_tokens.npy")
    started = time.perf_counter()
    path = train_target_lm(tokenizer, train, heldout, recipe, work / "assistant_state", out / "assistant",
                           label="assistant LM")
    report = assistant_report(path, heldout, recipe)
    report["train_s_this_run"] = round(time.perf_counter() - started, 1)
    print(json.dumps({"assistant": str(path), **report}))
    return path


def assistant_report(path: Path, heldout: np.ndarray, recipe: AssistantRecipe) -> dict:
    """Size and held-out loss (nats/token, the target's evaluation windows) of the saved bf16 assistant."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype="float32")
    size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    return {"parameters": sum(p.numel() for p in model.parameters()), "folder_bytes": size,
            "within_budget": size <= SIZE_BUDGET_BYTES, "vocab_size": model.config.vocab_size,
            "heldout_loss": round(heldout_loss(model, heldout, recipe), 4)}
