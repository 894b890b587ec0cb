"""`dflash features`: the target's features over a data set, computed once and stored (`dflash train --features`)."""

from __future__ import annotations

import sys
from pathlib import Path

from dflash_core.dtypes import SHORT_NAMES, short_name
from dflash_core.errors import ConfigError
from dflash_core.files.atomic import guard_output
from dflash_core.target.checks import read_target_config
from dflash_core.training.data import INDEX_FILE, data_fingerprint, target_fingerprint
from dflash_core.training.recipe import feature_layer_ids

from dflash_cli import flags
from dflash_cli.common import add_runtime_args, apply_threads, load_target_in, tuning_for


def add_parser(commands) -> None:
    p = commands.add_parser("features", help="store the target's features of a data set once (train --features)")
    p.add_argument("--target", required=True, help="Hugging Face target model directory")
    p.add_argument("--data", required=True, action="append",
                   help="data directory made by `dflash data`; repeat it for several, joined in order (train with the "
                        "same --data list)")
    p.add_argument("--out", required=True, type=Path, help="feature cache directory (resumed if it exists)")
    p.add_argument("--force", action="store_true", help="write into an --out that holds other files")
    layers = p.add_mutually_exclusive_group()
    layers.add_argument("--target-layer-ids", type=flags.listed(flags.integer(0), "layer ids"), default=None,
                        help="comma-separated target layers to keep")
    layers.add_argument("--feature-layers", type=flags.listed(flags.integer(1), "counts"), default=[1],
                        help="keep the layers `dflash train --feature-layers N` reads, for each N listed (e.g. 1,3,5: "
                             "the union, to compare them on one extraction); default 1 (the middle layer)")
    p.add_argument("--store-dtype", choices=SHORT_NAMES, default="bf16", help="precision the features are stored in")
    p.add_argument("--shard-size", type=flags.integer(1), default=64, help="samples per shard (the unit of resume)")
    p.add_argument("--batch-tokens", type=flags.integer(1), default=4096,
                   help="padded tokens per target forward (samples grouped by length)")
    p.add_argument("--no-progress", action="store_true")
    add_runtime_args(p, default_dtype="auto", allow_auto=True)
    p.set_defaults(run=run)


def layer_ids(args, num_layers: int) -> tuple[int, ...]:
    if args.target_layer_ids is not None:
        ids = tuple(sorted(set(args.target_layer_ids)))
        if ids[-1] >= num_layers:
            raise ConfigError(f"--target-layer-ids {','.join(map(str, ids))} reach layer {ids[-1]}, but the target "
                              f"has {num_layers} layers (expected ids in [0, {num_layers})).")
        return ids
    return tuple(sorted({i for count in args.feature_layers for i in feature_layer_ids(num_layers, 1, count)}))


def run(args) -> int:
    from dflash_core.training.features import extract_features, load_or_start_feature_index
    from dflash_core.training.trainer import load_data

    apply_threads(args.threads)
    config = read_target_config(Path(args.target))
    ids = layer_ids(args, int(config.get("num_hidden_layers", 0)))
    data = load_data(args.data)
    guard_output(args.out, [args.target, *args.data], force=args.force,
                 is_own_state=lambda out: (out / INDEX_FILE).is_file())
    fingerprint = target_fingerprint(args.target)
    if args.dtype != "auto":  # other settings or a corrupt index: refused before the target loads
        load_or_start_feature_index(args.out, _settings(args, fingerprint, data, ids, args.dtype), len(data))
    target, dtype = load_target_in(args.target, args.dtype, args.device, workload="train", tuning=tuning_for(args))
    settings = _settings(args, fingerprint, data, ids, short_name(dtype))
    index = extract_features(target, data, args.out, settings, batch_tokens=args.batch_tokens,
                             progress=not args.no_progress)
    tokens = sum(s["tokens"] for s in index["shards"])
    print(f"{args.out}: features of layers {list(ids)} for {index['samples']} samples, {tokens} tokens in "
          f"{len(index['shards'])} shards", file=sys.stderr)
    return 0


def _settings(args, fingerprint: str, data, ids: tuple[int, ...], compute_dtype: str):
    from dflash_core.training.features import FeatureSettings

    return FeatureSettings(target=fingerprint, data=data_fingerprint(data), layer_ids=ids, compute_dtype=compute_dtype,
                           store_dtype=args.store_dtype, shard_size=args.shard_size)
