"""`dflash bench`: drafter latency vs block size, and end-to-end DFlash and its peers vs the target alone.

The benchmarks live in the `dflash_bench` tool package (tools/bench), installed by `make setup`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dflash_core.dtypes import SHORT_NAMES
from dflash_core.errors import ConfigError, DFlashError
from dflash_core.files.atomic import guard_output

from dflash_cli import flags
from dflash_cli.common import apply_threads

DTYPES = flags.listed(flags.one_of(SHORT_NAMES), f"dtypes ({', '.join(SHORT_NAMES)})")
RESULT_SUFFIXES = (".json", ".md", ".png", ".csv", ".txt")


def _is_results_dir(out: Path) -> bool:
    """A folder of earlier results (JSON, Markdown, plots): a benchmark adds or replaces its own files there."""
    return all(p.name.startswith(".") or (p.is_file() and p.suffix in RESULT_SUFFIXES) for p in out.iterdir())


def _check_drafter_shapes(hidden: int, layers: list[int]) -> None:
    from dflash_bench.drafter_latency import drafter_config

    for n in layers:
        try:
            drafter_config(n, hidden)
        except ConfigError as exc:
            raise DFlashError(f"--hidden {hidden} with --layers {n} gives no valid drafter ({str(exc).rstrip('.')}); "
                              "expected e.g. a power of two >= 64 and at most 6 layers.") from None


def add_parser(commands) -> None:
    p = commands.add_parser("bench", help="benchmarks (JSON + Markdown table + plot)")
    kinds = p.add_subparsers(dest="kind", required=True, metavar="KIND")
    d = kinds.add_parser("drafter", help="drafter forward latency at several block sizes")
    d.add_argument("--hidden", type=flags.integer(64), default=1024)
    d.add_argument("--context", type=flags.integer(1), default=512)
    d.add_argument("--layers", type=flags.listed(flags.integer(1), "integers >= 1"), default="1,5")
    d.add_argument("--blocks", type=flags.listed(flags.integer(1), "integers >= 1"), default="4,8,16,32")
    d.add_argument("--dtypes", type=DTYPES, default="fp32,bf16")
    d.add_argument("--repeats", type=flags.integer(1), default=30)
    e = kinds.add_parser("e2e", help="DFlash and its peers vs the target alone on held-out prompts")
    e.add_argument("--pair", action="append", default=[], metavar="LABEL=TARGET:DRAFTER[:BACKEND]",
                   help="a target/drafter pair to measure (repeatable; default: the demo pair)")
    e.add_argument("--prompts-file", type=Path, default=None, help="JSONL prompts (default: demo held-out)")
    e.add_argument("--prompts", type=flags.integer(1), default=16)
    e.add_argument("--max-new-tokens", type=flags.integer(1), default=256)
    e.add_argument("--dtypes", type=flags.listed(flags.one_of(("auto",) + SHORT_NAMES), "dtypes (auto, "
                                                   f"{', '.join(SHORT_NAMES)})"), default="auto")
    e.add_argument("--temperatures", type=flags.listed(flags.number(0.0), "finite numbers >= 0"), default="0")
    e.add_argument("--device", type=flags.device, default="cpu", help="torch device of target and drafter")
    e.add_argument("--methods", default=None,
                   help="decoding methods to compare (ar,dflash,dflash_drafter,dflash_full,dflash_plain_weights,"
                        "dflash_fp16_weights,dflash_trimmed,prompt_lookup,assisted,hf_generate; ar is always run); "
                        "default ar,dflash,dflash_drafter,"
                        "dflash_full,prompt_lookup, plus assisted where every pair has an assistant model beside its target")
    e.add_argument("--batch-sizes", type=flags.listed(flags.integer(1), "integers >= 1"), default=[1],
                   help="prompts decoded together, e.g. 1,4,16 (default 1)")
    e.add_argument("--repeats", type=flags.integer(1), default=1,
                   help="rounds of every method per batch, the fastest kept (steadier per-prompt ratios)")
    e.add_argument("--name", type=flags.file_stem, default="e2e")
    e.add_argument("--title", default="DFlash and its peers vs the target alone")
    for sub in (d, e):
        sub.add_argument("--out", type=Path, default=Path("docs/results"), help="results directory")
        sub.add_argument("--force", action="store_true", help="write into an --out that holds other files")
        sub.add_argument("--threads", type=flags.integer(0), default=0)
    p.set_defaults(run=run)


def _pairs(args, models_dir) -> list:
    from dflash_bench.e2e import PairSpec

    if not args.pair:
        models = models_dir()
        return [PairSpec("demo", models / "target", models / "drafter")]
    pairs = []
    for text in args.pair:
        label, _, rest = text.partition("=")
        parts = rest.split(":")
        if not label or len(parts) not in (2, 3):
            raise DFlashError(f"--pair {text!r} is malformed; expected LABEL=TARGET:DRAFTER[:BACKEND].")
        target, drafter = Path(parts[0]), Path(parts[1])
        missing = target if not (target / "config.json").is_file() else None if drafter.exists() else drafter
        if missing:
            raise DFlashError(f"--pair {label}: {missing} does not exist, expected a target model directory "
                              "(TARGET) and a drafter (DRAFTER).")
        pairs.append(PairSpec(label, target, drafter, parts[2] if len(parts) == 3 else "torch"))
    return pairs


def run(args) -> int:
    try:
        from dflash_bench import drafter_latency, e2e
        from dflash_demo.paths import default_models_dir
    except ImportError:
        raise DFlashError("benchmarks need the dflash-bench and dflash-demo tool packages: `make setup` installs "
                          "them (pip install -e tools/bench -e tools/demo).") from None
    apply_threads(args.threads)
    command = "dflash " + " ".join(sys.argv[1:]) if sys.argv[0].endswith("dflash") else "dflash bench"
    if args.kind == "drafter":
        _check_drafter_shapes(args.hidden, args.layers)
        guard_output(args.out, [], force=args.force, is_own_state=_is_results_dir)
        path = drafter_latency.run(args.out, hidden=args.hidden, context=args.context, layers=args.layers,
                                   blocks=args.blocks, dtypes=args.dtypes, repeats=args.repeats, command=command)
    else:
        prompts = args.prompts_file or default_models_dir() / "heldout.jsonl"
        pairs = _pairs(args, default_models_dir)
        guard_output(args.out, [prompts, *[p.target for p in pairs], *[p.drafter for p in pairs]], force=args.force,
                     is_own_state=_is_results_dir)
        methods = ["ar", "dflash", "dflash_drafter", "dflash_full", "prompt_lookup"]
        if args.methods is not None:
            methods = [m.strip() for m in args.methods.split(",")]
        elif all((p.assistant / "config.json").is_file() for p in pairs):
            methods.append("assisted")
        try:
            path = e2e.run(args.out, pairs, prompts, prompts=args.prompts,
                           max_new_tokens=args.max_new_tokens, dtypes=args.dtypes,
                           temperatures=args.temperatures, device=args.device,
                           methods=methods, batch_sizes=args.batch_sizes,
                           name=args.name, title=args.title, command=command, repeats=args.repeats)
        except e2e.OutputMismatch as exc:  # not bad input: a decoder broke losslessness (exit 1)
            print(exc.report.read_text())
            print(f"dflash bench: error: {exc}", file=sys.stderr)
            return 1
    print(path.read_text())
    return 0
