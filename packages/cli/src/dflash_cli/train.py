"""`dflash train`: train a DFlash drafter for a target (one process, or under torchrun)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

from dflash_core.model.draft_vocab import DEFAULT_COVERAGE
from dflash_core.dtypes import SHORT_NAMES, resolve_dtype
from dflash_core.errors import ConfigError
from dflash_core.files.atomic import guard_output
from dflash_core.loading import load_target, load_tokenizer
from dflash_core.target.pieces import load_target_pieces
from dflash_core.training.data import read_prompts, target_fingerprint
from dflash_core.training.recipe import DISTILL_MODES, LOSS_VOCABS, TrainConfig

from dflash_cli import flags
from dflash_cli.common import add_runtime_args, apply_threads, load_target_in, tuning_for


def add_parser(commands) -> None:
    p = commands.add_parser("train", help="train a DFlash drafter (torchrun for several processes)")
    p.add_argument("--target", required=True, help="Hugging Face target model directory (with tokenizer)")
    p.add_argument("--data", required=True, action="append",
                   help="data directory made by `dflash data`; repeat it to train on several, joined in order")
    p.add_argument("--features", default=None, metavar="DIR",
                   help="train from the target features `dflash features` stored for the same --data list: the "
                        "target's layers never run (only its embedding and LM head are loaded, unless --eval-prompts "
                        "needs the whole target); --dtype auto is then the precision they were computed in")
    p.add_argument("--out", required=True, type=Path, help="drafter output (published format); resumes if present")
    p.add_argument("--force", action="store_true",
                   help="write into an --out that holds other files (a drafter there is replaced)")
    d = TrainConfig()
    p.add_argument("--layers", type=flags.integer(1), default=d.draft_layers, help="draft layers")
    p.add_argument("--block-size", type=flags.integer(2), default=d.block_size)
    p.add_argument("--intermediate-size", type=flags.integer(1), default=None,
                   help="the draft layers' MLP width (default: the target's); narrower makes a smaller, cheaper drafter")
    features = p.add_mutually_exclusive_group()
    features.add_argument("--target-layer-ids", default=None,
                          help="comma-separated target layers (default: reference spacing)")
    features.add_argument("--feature-layers", type=flags.integer(1), default=None,
                          help="how many target layers feed the drafter, evenly spaced by the reference rule "
                               "(1: the middle layer; the target's layer count: all); default: as many as --layers")
    p.add_argument("--anchors", type=flags.integer(1), default=d.anchors, help="anchor blocks per sequence")
    p.add_argument("--gamma", type=flags.number(above=0.0), default=None,
                   help="loss decay (default: published value for the block)")
    p.add_argument("--lr", type=flags.number(above=0.0), default=d.learning_rate)
    p.add_argument("--weight-decay", type=flags.number(0.0), default=d.weight_decay)
    p.add_argument("--warmup-ratio", type=flags.number(0.0, 1.0, at_most=False), default=d.warmup_ratio)
    p.add_argument("--epochs", type=flags.number(above=0.0), default=d.epochs)
    p.add_argument("--max-steps", type=flags.integer(1), default=None)
    p.add_argument("--batch-size", type=flags.integer(1), default=d.batch_size,
                   help="sequences per micro-batch per process")
    p.add_argument("--grad-accum", type=flags.integer(1), default=d.grad_accum)
    p.add_argument("--clip", type=flags.number(above=0.0), default=d.grad_clip)
    p.add_argument("--max-length", type=flags.integer(3), default=d.max_length)
    p.add_argument("--no-bf16", action="store_true",
                   help="train in fp32 even where --dtype picks bf16 (same as --dtype fp32)")
    p.add_argument("--distill", type=flags.one_of(DISTILL_MODES), default=d.distill,
                   help="labels: hard (the data's tokens), soft (the target's full next-token distribution) or "
                        "mix ((1-W)*hard + W*soft)")
    p.add_argument("--distill-weight", type=flags.number(0.0, 1.0), default=d.distill_weight,
                   help="W, the soft labels' share of the loss with --distill mix")
    p.add_argument("--distill-temperature", type=flags.number(above=0.0), default=d.distill_temperature,
                   help="temperature of both distributions in the soft-label term")
    p.add_argument("--init-from-target", action="store_true",
                   help="start draft layer i as target layer L-D+i (the last D layers) and the final norm as the "
                        "target's (Qwen3 and Llama layouts); default: random init")
    p.add_argument("--init-from", default=None, metavar="DRAFTER",
                   help="start from this drafter's weights (published format; the drafter this run builds must "
                        "match it): continue a trained drafter on other data; default: a fresh drafter")
    p.add_argument("--grow-from", default=None, metavar="DRAFTER",
                   help="start as this trained drafter's function in a deeper drafter or one fed by more target "
                        "layers (--layers, --feature-layers): its layers and fc blocks copied, the new ones adding "
                        "zero until trained")
    p.add_argument("--mask-token", default=d.mask_token,
                   help=f"the drafter's mask token (default {d.mask_token}, added when absent; needs a spare embedding "
                        "row): else an existing reserved token, e.g. <empty_output> for SmolLM2")
    p.add_argument("--seed", type=flags.seed, default=d.seed)
    p.add_argument("--checkpoint-every", type=flags.integer(1), default=100)
    p.add_argument("--eval-prompts", default=None, help="JSONL held-out prompts for periodic tau")
    p.add_argument("--eval-count", type=flags.integer(1), default=8, help="held-out prompts used per evaluation")
    p.add_argument("--eval-every", type=flags.integer(0), default=0,
                   help="evaluate tau every N steps (0: only at the end)")
    p.add_argument("--eval-max-new-tokens", type=flags.integer(1), default=64)
    p.add_argument("--save-dtype", choices=SHORT_NAMES, default="bf16")
    vocab = p.add_mutually_exclusive_group()
    vocab.add_argument("--draft-vocab-coverage", type=flags.number(maximum=1.0, above=0.0), default=DEFAULT_COVERAGE,
                       help="write draft_vocab.json: the most frequent response tokens of the data, as many as "
                            f"cover this share of them; drafts are read out over those only (default {DEFAULT_COVERAGE})")
    vocab.add_argument("--no-draft-vocab", action="store_true",
                       help="no draft_vocab.json: drafts are read out over the whole vocabulary")
    p.add_argument("--loss-vocab", type=flags.one_of(LOSS_VOCABS), default=d.loss_vocab,
                   help="the loss's softmax over the whole vocabulary (full) or over the read-out list only (list: "
                        "what greedy drafts are read out over; far cheaper steps for a large vocabulary; sampled "
                        "drafts then stay on the list too)")
    p.add_argument("--no-progress", action="store_true")
    add_runtime_args(p, default_dtype="auto", allow_auto=True)
    p.set_defaults(run=run)


def _layer_ids(text: str | None):
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"--target-layer-ids is {text!r}, expected comma-separated integers.") from None


def _load_target(args, place, features, whole: bool):
    """(target, dtype): the whole target, or with a feature cache and nothing to decode its embedding and LM head
    alone; --dtype auto with a cache is the precision its features were computed in."""
    dtype = "fp32" if args.no_bf16 else args.dtype
    if features is None:
        return load_target_in(args.target, dtype, str(place.device), args.block_size, workload="train",
                              tuning=tuning_for(args))
    if dtype == "auto":
        dtype = features.settings.compute_dtype
        print(f"dtype {dtype}: the precision feature cache {features.path} was computed in", file=sys.stderr)
    load = load_target if whole else load_target_pieces
    return load(args.target, dtype=dtype, device=str(place.device)), resolve_dtype(dtype)


def run(args) -> int:
    from dflash_core.training.features import FeatureCache
    from dflash_core.training.trainer import STATE_DIR, RunOptions, Trainer, init_distributed, load_data

    apply_threads(args.threads)
    train = TrainConfig(draft_layers=args.layers, block_size=args.block_size, target_layer_ids=_layer_ids(
        args.target_layer_ids), anchors=args.anchors, gamma=args.gamma, learning_rate=args.lr,
        weight_decay=args.weight_decay, warmup_ratio=args.warmup_ratio, epochs=args.epochs, max_steps=args.max_steps,
        batch_size=args.batch_size, grad_accum=args.grad_accum, grad_clip=args.clip, max_length=args.max_length,
        seed=args.seed, distill=args.distill, distill_weight=args.distill_weight,
        distill_temperature=args.distill_temperature, feature_layers=args.feature_layers,
        init_from_target=args.init_from_target, init_from=args.init_from, grow_from=args.grow_from,
        mask_token=args.mask_token, loss_vocab=args.loss_vocab, intermediate_size=args.intermediate_size)
    if args.loss_vocab == "list" and args.no_draft_vocab:
        raise ConfigError("--loss-vocab list needs the read-out list that --no-draft-vocab turns off: expected one "
                          "or the other.")
    eval_prompts = read_prompts(args.eval_prompts)[: args.eval_count] if args.eval_prompts else []
    inputs = [args.target, *args.data] + [p for p in (args.eval_prompts, args.init_from, args.grow_from, args.features)
                                          if p]
    # resumable state is OUT/train_state; a published drafter without it is someone's work, kept unless --force
    guard_output(args.out, inputs, force=args.force, is_own_state=lambda out: (out / STATE_DIR).is_dir())
    place = init_distributed(args.device)
    data = load_data(args.data)
    features = None
    if args.features:
        features = FeatureCache(args.features)
        features.check_fits(target_fingerprint(args.target), data)
    # bf16 autocast exactly when the target runs in bf16: 'auto' picks it only where a training-sized forward
    # is measured faster (or, from a feature cache, where it was computed in bf16)
    target, dtype = _load_target(args, place, features, bool(eval_prompts))
    if place.world > 1:  # every process must train in one precision: bf16 only if all of them picked it
        agreed = torch.tensor([int(dtype == torch.bfloat16)], device=place.device)
        torch.distributed.all_reduce(agreed, op=torch.distributed.ReduceOp.MIN)
        dtype = torch.bfloat16 if agreed.item() else torch.float32
        target.model.to(dtype)
    train = replace(train, bf16=dtype == torch.bfloat16)
    options = RunOptions(out=args.out, checkpoint_every=args.checkpoint_every, eval_every=args.eval_every,
                         eval_prompts=eval_prompts, eval_max_new_tokens=args.eval_max_new_tokens,
                         save_dtype=args.save_dtype, progress=not args.no_progress,
                         draft_vocab_coverage=None if args.no_draft_vocab else args.draft_vocab_coverage)
    trainer = Trainer(target, load_tokenizer(args.target), data, train, options, place, features)
    report = trainer.run()
    if place.main:
        summary = {k: report[k] for k in ("steps", "tau", "replicas_identical")} | {
            "final_loss": report["history"][-1] if report["history"] else None, "out": str(args.out)}
        print(json.dumps(summary), file=sys.stderr)
    return 0
