"""The training recipe's settings, and the drafter shape derived from a target."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from ..config import DFlashConfig, build_target_layer_ids
from ..errors import ConfigError

# published loss decay per block size (reference §3); others fall back to block_size/2 - 1
PUBLISHED_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}


def default_gamma(block_size: int) -> float:
    return PUBLISHED_GAMMA.get(block_size, max(1.0, block_size / 2 - 1))


@dataclass(frozen=True)
class TrainConfig:
    """Everything that shapes a training run; resuming demands the same values (except `schedule-free` ones)."""

    draft_layers: int = 1
    """Number of draft decoder layers."""
    block_size: int = 16
    """Block length B: anchor + B-1 masks."""
    target_layer_ids: tuple[int, ...] | None = None
    """Target layers feeding the drafter; None = evenly spaced from 1 to L-3 (reference)."""
    anchors: int = 32
    """Anchor positions sampled per sequence (inside the response), resampled every epoch."""
    gamma: float | None = None
    """Loss decay w_k = exp(-(k-1)/gamma); None = the published value for the block size."""
    learning_rate: float = 6e-4
    weight_decay: float = 0.01
    warmup_ratio: float = 0.04
    """Fraction of optimizer steps spent warming up linearly."""
    min_lr_ratio: float = 0.1
    """Cosine decay ends at learning_rate * min_lr_ratio."""
    epochs: float = 6.0
    max_steps: int | None = None
    """Stop after this many optimizer steps (overrides epochs when set)."""
    batch_size: int = 8
    """Sequences per micro-batch per process."""
    grad_accum: int = 1
    """Micro-batches per optimizer step."""
    grad_clip: float = 1.0
    max_length: int = 3072
    """Sequences are cut to this many tokens."""
    bf16: bool = True
    """bf16 autocast for the drafter (and a bf16 target) where the device supports it."""
    init_std: float = 0.02
    seed: int = 0

    # fields that may change between a run and its resumption
    RESUMABLE_CHANGES = ("max_steps", "epochs")

    def __post_init__(self) -> None:
        checks = [
            (self.draft_layers >= 1, "draft_layers", "an integer >= 1"),
            (self.block_size >= 2, "block_size", "an integer >= 2"),
            (self.anchors >= 1, "anchors", "an integer >= 1"),
            (0 < self.learning_rate < math.inf, "learning_rate", "a positive finite number"),
            (0 <= self.weight_decay < math.inf, "weight_decay", "a finite number >= 0"),
            (0 <= self.warmup_ratio < 1, "warmup_ratio", "a fraction in [0, 1)"),
            (0 <= self.min_lr_ratio <= 1, "min_lr_ratio", "a fraction in [0, 1]"),
            (0 < self.epochs < math.inf, "epochs", "a positive finite number"),
            (self.max_steps is None or self.max_steps >= 1, "max_steps", "an integer >= 1"),
            (self.batch_size >= 1, "batch_size", "an integer >= 1"),
            (self.grad_accum >= 1, "grad_accum", "an integer >= 1"),
            (0 < self.grad_clip < math.inf, "grad_clip", "a positive finite number"),
            (self.max_length >= self.block_size + 1, "max_length", "more than block_size tokens"),
            (self.gamma is None or 0 < self.gamma < math.inf, "gamma", "a positive finite number"),
            (0 < self.init_std < math.inf, "init_std", "a positive finite number"),
            (0 <= self.seed < 2**64, "seed", "an integer in [0, 2^64)"),
        ]
        for ok, name, expected in checks:
            if not ok:
                raise ConfigError(f"training setting '{name}' is {getattr(self, name)!r}, expected {expected}.")

    @property
    def loss_gamma(self) -> float:
        return self.gamma if self.gamma is not None else default_gamma(self.block_size)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["target_layer_ids"] = list(self.target_layer_ids) if self.target_layer_ids else None
        return data

    def differences(self, saved: dict) -> list[str]:
        """Names of fields that differ from a saved run's settings (ignoring resumable ones)."""
        now = self.to_dict()
        return [f.name for f in fields(self) if f.name not in self.RESUMABLE_CHANGES
                and saved.get(f.name) != now[f.name]]


def drafter_config_for(target, mask_token_id: int, train: TrainConfig) -> DFlashConfig:
    """A drafter shaped like the target's own layers (as the published drafters are)."""
    c = target.config
    layers = target.num_layers
    # the reference spacing repeats ids when the target is shallow (e.g. 5 draft layers on 6 target
    # layers); each feature layer is captured once
    ids = train.target_layer_ids or tuple(sorted(set(build_target_layer_ids(layers, train.draft_layers))))
    heads = c.num_attention_heads
    return DFlashConfig(
        hidden_size=target.hidden_size,
        num_hidden_layers=train.draft_layers,
        num_attention_heads=heads,
        num_key_value_heads=getattr(c, "num_key_value_heads", None) or heads,
        head_dim=getattr(c, "head_dim", None) or target.hidden_size // heads,
        intermediate_size=c.intermediate_size,
        vocab_size=target.vocab_size,
        block_size=train.block_size,
        num_target_layers=layers,
        target_layer_ids=tuple(ids),
        mask_token_id=mask_token_id,
        rms_norm_eps=getattr(c, "rms_norm_eps", 1e-6),
        rope_theta=float(getattr(c, "rope_theta", None) or (getattr(c, "rope_parameters", None) or {}).get(
            "rope_theta", 10000.0)),
        max_position_embeddings=getattr(c, "max_position_embeddings", 40960),
        dtype="bfloat16",
    )
