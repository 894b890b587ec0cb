"""Train the demo target: a small Qwen3-architecture causal LM on the standard library's source.

Batches are a pure function of (seed, step), and the state is checkpointed with the optimizer,
so a killed run resumes exactly where it stopped.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from dflash_core.errors import ConfigError
from dflash_core.training.train_state import has_training_state, load_training_state, save_training_state
from dflash_core.training.schedule import warmup_cosine


@dataclass(frozen=True)
class TargetRecipe:
    """Shape and schedule of the demo target."""

    hidden_size: int = 384
    num_layers: int = 6
    num_heads: int = 6
    num_kv_heads: int = 2
    intermediate_size: int = 1024
    max_positions: int = 2048
    rope_theta: float = 10000.0
    seq_len: int = 512
    batch_size: int = 8
    steps: int = 2200
    peak_lr: float = 1e-3
    warmup_steps: int = 100
    weight_decay: float = 0.1
    seed: int = 0
    eval_every: int = 250
    checkpoint_every: int = 100
    autocast_bf16: bool = True  # bf16 autocast pays only with AVX512-BF16/AMX; on AVX2 alone fp32 is ~6x faster


def encode_documents(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> np.ndarray:
    """One int32 token stream: each document followed by end-of-text."""
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for start in range(0, len(texts), 64):
        for row in tokenizer(texts[start : start + 64], add_special_tokens=False)["input_ids"]:
            ids.extend(row)
            ids.append(eos)
    return np.asarray(ids, dtype=np.int32)


def batch_at(stream: np.ndarray, step: int, batch_size: int, seq_len: int, seed: int) -> torch.Tensor:
    """Random windows of `seq_len + 1` tokens, the same for the same (seed, step): [batch, seq_len+1]."""
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, len(stream) - seq_len - 1, size=batch_size)
    rows = np.stack([stream[s : s + seq_len + 1] for s in starts])
    return torch.from_numpy(rows.astype(np.int64))


def build_model(recipe: TargetRecipe, tokenizer: PreTrainedTokenizerFast) -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_kv_heads,
        head_dim=recipe.hidden_size // recipe.num_heads,
        max_position_embeddings=recipe.max_positions,
        rope_theta=recipe.rope_theta,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(recipe.seed)
    return Qwen3ForCausalLM(config)


@torch.no_grad()
def heldout_loss(model: Qwen3ForCausalLM, stream: np.ndarray, recipe: TargetRecipe, batches: int = 4) -> float:
    model.eval()
    losses = []
    for i in range(batches):
        tokens = batch_at(stream, i, recipe.batch_size, recipe.seq_len, seed=12345)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=recipe.autocast_bf16):
            losses.append(model(input_ids=tokens, labels=tokens).loss.item())
    model.train()
    return float(np.mean(losses))


def _check_resume(state_meta: dict, recipe: TargetRecipe) -> None:
    saved = state_meta.get("recipe", {})
    defaults = dataclasses.asdict(type(recipe)())  # a field added since the state was saved has its default
    differ = [k for k, v in dataclasses.asdict(recipe).items() if k != "steps" and saved.get(k, defaults[k]) != v]
    if differ:
        raise ConfigError(f"cannot resume: the saved run used a different recipe ({', '.join(differ)} differ).")


def train_target_lm(
    tokenizer: PreTrainedTokenizerFast,
    train_stream: np.ndarray,
    heldout_stream: np.ndarray,
    recipe: TargetRecipe,
    state_dir: Path,
    out_dir: Path,
    label: str = "target LM",
) -> Path:
    """Train (or resume) a causal LM of `recipe`'s shape and save it, with its tokenizer, in HF format (bf16)."""
    model = build_model(recipe, tokenizer)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": recipe.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=recipe.peak_lr,
        betas=(0.9, 0.95),
    )
    step = 0
    if has_training_state(state_dir):
        weights, meta = load_training_state(state_dir, optimizer)
        _check_resume(meta, recipe)
        model.load_state_dict(weights, strict=False)
        model.tie_weights()
        step = meta["step"]
    model.train()
    bar = tqdm(total=recipe.steps, initial=step, desc=label, dynamic_ncols=True)
    while step < recipe.steps:
        lr = warmup_cosine(step, recipe.steps, recipe.warmup_steps, recipe.peak_lr)
        for group in optimizer.param_groups:
            group["lr"] = lr
        tokens = batch_at(train_stream, step, recipe.batch_size, recipe.seq_len, recipe.seed)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=recipe.autocast_bf16):
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        bar.update(1)
        postfix = {"loss": f"{loss.item():.3f}", "lr": f"{lr:.2e}"}
        if step % recipe.eval_every == 0 or step == recipe.steps:
            postfix["heldout"] = f"{heldout_loss(model, heldout_stream, recipe):.3f}"
            tqdm.write(f"step {step}: train loss {loss.item():.3f}, held-out loss {postfix['heldout']}")
        bar.set_postfix(postfix)
        if step % recipe.checkpoint_every == 0 or step == recipe.steps:
            meta = {"step": step, "recipe": dataclasses.asdict(recipe), "loss": loss.item()}
            save_training_state(state_dir, dict(model.state_dict()), optimizer, meta)
    bar.close()
    return save_target(model, tokenizer, out_dir)


def save_target(model: Qwen3ForCausalLM, tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> Path:
    """Hugging Face format in bf16 (the demo's working precision), tokenizer files alongside."""
    from dflash_core.files.atomic import atomic_directory

    model = model.to(torch.bfloat16).eval()
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=False
    )
    with atomic_directory(out_dir, overwrite=True) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    return out_dir


def perplexity(loss: float) -> float:
    return math.exp(loss)
