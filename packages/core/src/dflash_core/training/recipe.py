"""The training recipe's settings, and the drafter shape derived from a target."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from dflash_core.model.config import DFlashConfig, build_target_layer_ids
from dflash_core.errors import ConfigError
from dflash_core.target.pairing import MASK_TOKEN

# published loss decay per block size (reference §3); others fall back to block_size/2 - 1
PUBLISHED_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}
# what a block position is trained against: the data's token, the target's distribution, or both
DISTILL_MODES = ("hard", "soft", "mix")
# what the loss's softmax runs over: the target's whole vocabulary, or the drafter's read-out list only
LOSS_VOCABS = ("full", "list")


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
    distill: str = "hard"
    """Labels: hard (the data's next token), soft (the target's full next-token distribution) or mix."""
    distill_weight: float = 0.5
    """Weight W of the soft term in mix: loss = (1-W)*hard + W*soft; in [0, 1]."""
    distill_temperature: float = 1.0
    """Temperature T of both distributions in the soft term (which is scaled by T^2); > 0."""
    feature_layers: int | None = None
    """How many target layers feed the drafter (evenly spaced); None = as many as draft layers."""
    init_from_target: bool = False
    """Initialise draft layer i from target layer L-D+i (the last D target layers) instead of randomly."""
    init_from: str | None = None
    """Start from this published-format drafter's weights (its config must be the one this run builds)."""
    grow_from: str | None = None
    """Start as this shallower (or fewer-featured) drafter's function, new layers and features at zero (grow.py)."""
    mask_token: str = MASK_TOKEN
    """The drafter's mask token: <|MASK|> (added when absent), or an existing token of the vocabulary."""
    intermediate_size: int | None = None
    """The draft layers' MLP width; None = the target's. A narrower MLP shrinks the drafter (a 1-layer drafter of
    Qwen2.5-Coder-1.5B is 98 MB in bf16 at the target's 8,960, 54 MB at 4,096) and its step."""
    loss_vocab: str = "full"
    """The loss's softmax over the whole vocabulary, or over the read-out list only ("list": the list greedy
    drafts are read out over, so the loss is the decoder's argmax; labels outside it leave the loss; the
    head's arithmetic shrinks by V / list size; the drafter's sampled drafts then stay on the list too)."""

    # fields that may change between a run and its resumption (bf16 follows the machine a run resumes on
    # under --dtype auto: the weights and optimizer state carry over; only that step's rounding differs)
    RESUMABLE_CHANGES = ("max_steps", "epochs", "bf16")

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
            (self.distill in DISTILL_MODES, "distill", f"one of {', '.join(DISTILL_MODES)}"),
            (0 <= self.distill_weight <= 1, "distill_weight", "a fraction in [0, 1]"),
            (0 < self.distill_temperature < math.inf, "distill_temperature", "a positive finite number"),
            (self.feature_layers is None or self.feature_layers >= 1, "feature_layers", "an integer >= 1"),
            (isinstance(self.mask_token, str) and bool(self.mask_token), "mask_token", "a non-empty token"),
            (self.loss_vocab in LOSS_VOCABS, "loss_vocab", f"one of {', '.join(LOSS_VOCABS)}"),
            (self.feature_layers is None or self.target_layer_ids is None, "feature_layers",
             "unset when target_layer_ids are given (one or the other)"),
            (self.init_from is None or not self.init_from_target, "init_from",
             "unset with init_from_target (one starting point or the other)"),
            (self.grow_from is None or (self.init_from is None and not self.init_from_target), "grow_from",
             "unset with init_from or init_from_target (one starting point or the other)"),
            (self.intermediate_size is None or self.intermediate_size >= 1, "intermediate_size", "an integer >= 1"),
            (self.intermediate_size is None or not self.init_from_target, "intermediate_size",
             "unset with init_from_target (the target's layers are copied at their own width)"),
        ]
        for ok, name, expected in checks:
            if not ok:
                raise ConfigError(f"training setting '{name}' is {getattr(self, name)!r}, expected {expected}.")

    @property
    def loss_gamma(self) -> float:
        return self.gamma if self.gamma is not None else default_gamma(self.block_size)

    @property
    def soft_weight(self) -> float:
        """Weight of the soft-label term: 0 for hard labels, 1 for soft, distill_weight for mix."""
        return {"hard": 0.0, "soft": 1.0}.get(self.distill, self.distill_weight)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["target_layer_ids"] = list(self.target_layer_ids) if self.target_layer_ids else None
        return data

    def differences(self, saved: dict) -> list[str]:
        """Names of fields that differ from a saved run's settings (ignoring resumable ones).

        A field the saved run lacks (it predates that field) counts as its default, so runs started
        before a field existed resume with the behaviour they had. `init_from` and `grow_from` compare as
        the folder they name, so `runs/x` and `./runs/x` (or its absolute path) are the same starting point.
        """
        now = self.to_dict()
        return [f.name for f in fields(self) if f.name not in self.RESUMABLE_CHANGES
                and not _same_setting(f.name, saved.get(f.name, f.default), now[f.name])]


def _same_setting(name: str, saved, now) -> bool:
    if name in ("init_from", "grow_from") and isinstance(saved, str) and isinstance(now, str):
        return Path(saved).resolve() == Path(now).resolve()
    return saved == now


def drafter_config_for(target, mask_token_id: int, train: TrainConfig) -> DFlashConfig:
    """A drafter shaped like the target's own layers (as the published drafters are)."""
    c = target.config
    layers = target.num_layers
    ids = train.target_layer_ids or feature_layer_ids(layers, train.draft_layers, train.feature_layers)
    heads = c.num_attention_heads
    return DFlashConfig(
        hidden_size=target.hidden_size,
        num_hidden_layers=train.draft_layers,
        num_attention_heads=heads,
        num_key_value_heads=getattr(c, "num_key_value_heads", None) or heads,
        head_dim=getattr(c, "head_dim", None) or target.hidden_size // heads,
        intermediate_size=train.intermediate_size or c.intermediate_size,
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


def feature_layer_ids(num_target_layers: int, draft_layers: int, count: int | None) -> tuple[int, ...]:
    """The target layers that feed the drafter when none are given explicitly.

    count None: the reference spacing for `draft_layers` (repeated ids of a shallow target, e.g. 5 draft
    layers on 6 target layers, are captured once). count N: N ids by the same rule (1 -> the middle
    layer, else evenly spaced from 1 to L-3); N = L takes every layer 0..L-1.
    """
    if count is None:
        return tuple(sorted(set(build_target_layer_ids(num_target_layers, draft_layers))))
    if count == num_target_layers:
        return tuple(range(num_target_layers))
    if count > num_target_layers:
        raise ConfigError(f"feature_layers is {count} but the target has {num_target_layers} layers: expected at "
                          f"most {num_target_layers}.")
    shallow = count > 1 and num_target_layers < 4  # no layers between 1 and L-3
    ids = () if shallow else tuple(sorted(set(build_target_layer_ids(num_target_layers, count))))
    if len(ids) < count:
        raise ConfigError(
            f"feature_layers is {count} but the reference spacing (1 to L-3) of a {num_target_layers}-layer target "
            f"holds only {len(ids)} distinct layers: expected at most {len(ids)}, or {num_target_layers} for every "
            "layer (or give target_layer_ids)."
        )
    return ids
