"""`DFlashConfig`: the published drafter `config.json`, parsed once and validated at parse time.

The published format is a Qwen3 config with DFlash keys; each DFlash key may sit inside
`dflash_config` or at top level (`dflash_config` wins, as in SGLang). Unknown keys are kept in
`extra` and written back verbatim, so load -> save -> load is exact.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from dflash_core.dtypes import CONFIG_NAMES
from dflash_core.errors import ConfigError
from dflash_core.files.atomic import write_json

ARCHITECTURE = "DFlashDraftModel"
CONFIG_FILE = "config.json"
LAYER_TYPES = ("full_attention", "sliding_attention")
# rope types whose frequencies do not depend on the sequence length (so one graph serves all lengths)
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
# the parameters each scaled rope type needs (Hugging Face's initialisers read them), all positive numbers
ROPE_REQUIRED = {"linear": ("factor",), "yarn": ("factor",),
                 "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}

# Keys this module interprets; everything else in config.json lands in `extra`.
_DFLASH_KEYS = ("block_size", "num_target_layers", "target_layer_ids", "mask_token_id")
_ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters")
_ALWAYS_WRITTEN = ("architectures", "model_type", "dflash_config", "dtype", "torch_dtype",
                   "use_sliding_window", "attention_bias", "tie_word_embeddings")


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """Default feature layers: evenly spaced from 1 to L-3; a single draft layer takes the middle one."""
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    start, end = 1, num_target_layers - 3
    if end < start:
        raise ConfigError(
            f"cannot choose target_layer_ids for a {num_target_layers}-layer target and "
            f"{num_draft_layers} draft layers: the default spacing needs at least 4 target layers; "
            "give target_layer_ids explicitly."
        )
    span = end - start
    return tuple(int(round(start + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers))


@dataclass(frozen=True)
class DFlashConfig:
    """Every field of a published DFlash drafter config, with its bounds checked on construction."""

    hidden_size: int
    """Width H of the drafter; equals the target's hidden size (features enter through `fc`)."""
    num_hidden_layers: int
    """Number of draft decoder layers (>= 1)."""
    num_attention_heads: int
    """Query heads per draft layer (>= 1)."""
    num_key_value_heads: int
    """Key/value heads per draft layer; divides num_attention_heads (GQA)."""
    head_dim: int
    """Size of one attention head; even, because RoPE rotates pairs."""
    intermediate_size: int
    """Width of the SwiGLU MLP (>= 1)."""
    vocab_size: int
    """Vocabulary of the target the drafter was made for; mask_token_id lies inside it."""
    block_size: int
    """Tokens per draft block: the last verified token plus block_size - 1 masks (>= 2)."""
    num_target_layers: int | None
    """Decoder layers of the target; None when the checkpoint does not say (checked against the target)."""
    target_layer_ids: tuple[int, ...]
    """Target layers whose outputs feed `fc`: id k is the output of layer k (HF hidden_states[k+1])."""
    mask_token_id: int
    """Token id that fills the block after its first position."""
    rms_norm_eps: float = 1e-6
    """Epsilon of every RMSNorm (> 0)."""
    rope_theta: float = 1_000_000.0
    """RoPE base frequency (> 0)."""
    rope_scaling: Mapping[str, Any] | None = field(default=None, hash=False)
    """RoPE scaling parameters with a `rope_type` of linear, llama3 or yarn; None for plain RoPE."""
    max_position_embeddings: int = 40960
    """Largest position the drafter is meant for (engines size RoPE tables with it)."""
    hidden_act: str = "silu"
    """MLP activation; only silu (SwiGLU) exists in published drafters."""
    layer_types: tuple[str, ...] | None = None
    """Per-layer attention kind, full_attention or sliding_attention; None means all full."""
    sliding_window: int | None = None
    """Window of sliding_attention layers: a key is visible when query_pos - key_pos < window."""
    dtype: str = "bfloat16"
    """Precision the checkpoint is meant to run in (float32, bfloat16 or float16)."""
    extra: Mapping[str, Any] = field(default_factory=dict, compare=True, hash=False)
    """Keys of config.json this class does not interpret, written back verbatim."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_layer_ids", tuple(self.target_layer_ids))
        if self.layer_types is not None:
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if self.rope_scaling is not None:
            object.__setattr__(self, "rope_scaling", MappingProxyType(dict(self.rope_scaling)))
        object.__setattr__(self, "extra", MappingProxyType(dict(self.extra)))
        _validate(self)

    def __deepcopy__(self, memo) -> "DFlashConfig":
        return self  # immutable: copies of a drafter may share it

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def num_feature_layers(self) -> int:
        return len(self.target_layer_ids)

    @property
    def fc_in_features(self) -> int:
        """Width of the concatenated target features: len(target_layer_ids) * hidden_size."""
        return self.num_feature_layers * self.hidden_size

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def layer_window(self, layer: int) -> int | None:
        """Sliding window of draft layer `layer`, or None for full attention."""
        if self.layer_types is None or self.layer_types[layer] == "full_attention":
            return None
        return self.sliding_window

    def replace(self, **changes: Any) -> "DFlashConfig":
        return replace(self, **changes)

    # ---- parsing and writing ---------------------------------------------------------------
    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], *, source: str = "config") -> "DFlashConfig":
        """Parse a published-format dict; every problem is one sentence naming the field."""
        return _parse(raw, source)

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "DFlashConfig":
        """Read `path/config.json` (or `path` itself when it is a JSON file)."""
        path = Path(path)
        file = path / CONFIG_FILE if path.is_dir() else path
        if not file.is_file():
            raise ConfigError(f"{file} does not exist: expected a drafter directory holding config.json.")
        try:
            raw = json.loads(file.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{file} is not valid JSON ({exc}).") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{file} must hold a JSON object, found {type(raw).__name__}.")
        return cls.from_dict(raw, source=str(file))

    def to_dict(self) -> dict[str, Any]:
        """The published layout: Qwen3 keys, top-level block_size, DFlash keys in dflash_config."""
        out: dict[str, Any] = {k: v for k, v in self.extra.items() if k != "dflash_config"}
        dflash_extra = dict(self.extra.get("dflash_config") or {})
        out.update(
            architectures=[ARCHITECTURE],
            model_type="qwen3",
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
            vocab_size=self.vocab_size,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            rope_scaling=dict(self.rope_scaling) if self.rope_scaling is not None else None,
            max_position_embeddings=self.max_position_embeddings,
            hidden_act=self.hidden_act,
            attention_bias=False,
            tie_word_embeddings=False,
            block_size=self.block_size,
            dtype=self.dtype,
        )
        if self.num_target_layers is not None:
            out["num_target_layers"] = self.num_target_layers
        if self.layer_types is not None:
            out["layer_types"] = list(self.layer_types)
            out["use_sliding_window"] = "sliding_attention" in self.layer_types
            out["sliding_window"] = self.sliding_window
        out["dflash_config"] = {
            **dflash_extra,
            "target_layer_ids": list(self.target_layer_ids),
            "mask_token_id": self.mask_token_id,
        }
        return out

    def save_pretrained(self, path: str | Path) -> None:
        """Write `path/config.json` atomically."""
        write_json(Path(path) / CONFIG_FILE, self.to_dict())


# ---- parsing ---------------------------------------------------------------------------------


def _int(raw: Mapping[str, Any], key: str, source: str, default: Any = ...) -> Any:
    value = raw.get(key, default)
    if value is ...:
        raise ConfigError(f"{source}: field '{key}' is missing (expected an integer).")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{source}: field '{key}' is {value!r}, expected an integer.")
    return value


def _number(raw: Mapping[str, Any], key: str, source: str, default: float) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{source}: field '{key}' is {value!r}, expected a number.")
    return float(value)


def _rope(raw: Mapping[str, Any], source: str) -> tuple[float, dict | None]:
    params = raw.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        theta = params["rope_theta"]
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    else:
        theta = raw.get("rope_theta", 1_000_000.0)
        scaling = raw.get("rope_scaling")
        if scaling is not None and not isinstance(scaling, dict):
            raise ConfigError(f"{source}: field 'rope_scaling' is {scaling!r}, expected an object or null.")
        scaling = dict(scaling) if scaling is not None else None
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        scaling = {k: v for k, v in scaling.items() if k != "type"} | {"rope_type": kind}
        if kind == "default":
            scaling = None
    if isinstance(theta, bool) or not isinstance(theta, (int, float)):
        raise ConfigError(f"{source}: field 'rope_theta' is {theta!r}, expected a positive number.")
    return float(theta), scaling


def _parse(raw: Mapping[str, Any], source: str) -> DFlashConfig:
    arch = raw.get("architectures")
    if arch is not None and (not isinstance(arch, list) or ARCHITECTURE not in arch):
        raise ConfigError(
            f"{source}: unknown architecture {arch!r}; expected {ARCHITECTURE!r} (a DFlash drafter)."
        )
    dflash = raw.get("dflash_config") or {}
    if not isinstance(dflash, dict):
        raise ConfigError(f"{source}: field 'dflash_config' is {dflash!r}, expected an object.")
    merged = {**raw, **{k: dflash[k] for k in _DFLASH_KEYS if k in dflash}}

    heads = _int(merged, "num_attention_heads", source)
    hidden = _int(merged, "hidden_size", source)
    layers = _int(merged, "num_hidden_layers", source)
    num_target_layers = _int(merged, "num_target_layers", source, None)
    ids = merged.get("target_layer_ids")
    if ids is None:
        if num_target_layers is None:
            raise ConfigError(
                f"{source}: neither 'dflash_config.target_layer_ids' nor 'num_target_layers' is given "
                "(expected the list of target layers whose outputs feed the drafter)."
            )
        ids = build_target_layer_ids(num_target_layers, layers)
    if not isinstance(ids, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ConfigError(f"{source}: field 'target_layer_ids' is {ids!r}, expected a list of integers.")
    if "block_size" not in merged:
        raise ConfigError(f"{source}: field 'block_size' is missing (expected an integer >= 2).")
    if "mask_token_id" not in merged:
        raise ConfigError(
            f"{source}: field 'dflash_config.mask_token_id' is missing (expected the id of the mask token)."
        )
    theta, scaling = _rope(merged, source)
    dtype = merged.get("dtype") or merged.get("torch_dtype") or "bfloat16"
    layer_types = merged.get("layer_types")
    if layer_types is not None and not isinstance(layer_types, (list, tuple)):
        raise ConfigError(f"{source}: field 'layer_types' is {layer_types!r}, expected a list with one entry per "
                          "draft layer.")
    consumed = {f.name for f in fields(DFlashConfig)} | set(_ROPE_KEYS) | set(_ALWAYS_WRITTEN)
    extra = {k: v for k, v in raw.items() if k not in consumed}
    leftover = {k: v for k, v in dflash.items() if k not in _DFLASH_KEYS}
    if leftover:
        extra["dflash_config"] = leftover
    try:
        return DFlashConfig(
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=_int(merged, "num_key_value_heads", source, heads),
            head_dim=_int(merged, "head_dim", source, hidden // heads if heads else 0),
            intermediate_size=_int(merged, "intermediate_size", source),
            vocab_size=_int(merged, "vocab_size", source),
            block_size=_int(merged, "block_size", source),
            num_target_layers=num_target_layers,
            target_layer_ids=tuple(ids),
            mask_token_id=_int(merged, "mask_token_id", source),
            rms_norm_eps=_number(merged, "rms_norm_eps", source, 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=_int(merged, "max_position_embeddings", source, 40960),
            hidden_act=str(merged.get("hidden_act", "silu")),
            layer_types=tuple(layer_types) if layer_types is not None else None,
            sliding_window=_int(merged, "sliding_window", source, None),
            dtype=str(dtype),
            extra=extra,
        )
    except ConfigError as exc:  # field checks of the dataclass do not know the file; _int's messages do
        raise ConfigError(str(exc) if str(exc).startswith(f"{source}:") else f"{source}: {exc}") from None


# ---- validation ------------------------------------------------------------------------------


def _validate(c: DFlashConfig) -> None:
    for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings"):
        value = getattr(c, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"field '{name}' is {value!r}, expected a positive integer.")
    if isinstance(c.block_size, bool) or not isinstance(c.block_size, int) or c.block_size < 2:
        raise ConfigError(f"field 'block_size' is {c.block_size!r}, expected an integer >= 2.")
    if c.block_size > c.max_position_embeddings:
        raise ConfigError(f"field 'block_size' is {c.block_size}, expected at most max_position_embeddings "
                          f"({c.max_position_embeddings}): a block must fit in the drafter's positions.")
    if c.num_attention_heads % c.num_key_value_heads:
        raise ConfigError(
            f"field 'num_key_value_heads' is {c.num_key_value_heads}, expected a divisor of "
            f"num_attention_heads ({c.num_attention_heads})."
        )
    if c.head_dim % 2:
        raise ConfigError(f"field 'head_dim' is {c.head_dim}, expected an even number (RoPE rotates pairs).")
    if not c.target_layer_ids:
        raise ConfigError("field 'target_layer_ids' is empty, expected at least one target layer id.")
    ids = c.target_layer_ids
    if len(set(ids)) != len(ids):
        raise ConfigError(f"field 'target_layer_ids' is {list(ids)}, expected unique layer ids.")
    if list(ids) != sorted(ids):
        raise ConfigError(
            f"field 'target_layer_ids' is {list(ids)}, expected ascending order "
            "(engines concatenate target features in layer order)."
        )
    if c.num_target_layers is not None:
        if isinstance(c.num_target_layers, bool) or c.num_target_layers < 1:
            raise ConfigError(f"field 'num_target_layers' is {c.num_target_layers!r}, expected a positive integer.")
        bad = [i for i in ids if not 0 <= i < c.num_target_layers]
        if bad:
            raise ConfigError(
                f"field 'target_layer_ids' is {list(ids)}, expected ids within [0, {c.num_target_layers}) "
                f"for a {c.num_target_layers}-layer target (offending: {bad})."
            )
    elif min(ids) < 0:
        raise ConfigError(f"field 'target_layer_ids' is {list(ids)}, expected non-negative ids.")
    if isinstance(c.mask_token_id, bool) or not 0 <= c.mask_token_id < c.vocab_size:
        raise ConfigError(
            f"field 'mask_token_id' is {c.mask_token_id}, expected an id within the vocabulary [0, {c.vocab_size})."
        )
    if not (c.rms_norm_eps > 0 and math.isfinite(c.rms_norm_eps)):
        raise ConfigError(f"field 'rms_norm_eps' is {c.rms_norm_eps!r}, expected a positive number.")
    if not (c.rope_theta > 0 and math.isfinite(c.rope_theta)):
        raise ConfigError(f"field 'rope_theta' is {c.rope_theta!r}, expected a positive number.")
    _validate_rope_scaling(c.rope_scaling)
    if c.hidden_act != "silu":
        raise ConfigError(f"field 'hidden_act' is {c.hidden_act!r}, expected 'silu'.")
    if c.dtype not in CONFIG_NAMES:
        raise ConfigError(f"field 'dtype' is {c.dtype!r}, expected one of {', '.join(CONFIG_NAMES)}.")
    _validate_layer_types(c)


def _validate_rope_scaling(scaling: Mapping[str, Any] | None) -> None:
    if scaling is None:
        return
    kind = scaling.get("rope_type")
    if kind not in STATIC_ROPE_TYPES:
        raise ConfigError(f"field 'rope_scaling' has rope_type {kind!r}, expected one of "
                          f"{', '.join(STATIC_ROPE_TYPES)}.")
    for key in ROPE_REQUIRED.get(kind, ()):
        value = scaling.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
            raise ConfigError(f"field 'rope_scaling' ({kind}) has {key} {value!r}, expected a positive number "
                              f"(a {kind} rope_scaling needs {', '.join(ROPE_REQUIRED[kind])}).")


def _validate_layer_types(c: DFlashConfig) -> None:
    if c.layer_types is None:
        return
    if len(c.layer_types) != c.num_hidden_layers or any(t not in LAYER_TYPES for t in c.layer_types):
        raise ConfigError(
            f"field 'layer_types' is {list(c.layer_types)}, expected {c.num_hidden_layers} entries, each "
            f"one of {', '.join(LAYER_TYPES)}."
        )
    if "sliding_attention" in c.layer_types and (c.sliding_window is None or c.sliding_window < 1):
        raise ConfigError(
            f"field 'sliding_window' is {c.sliding_window!r}, expected a positive integer because "
            "layer_types has sliding_attention layers."
        )
