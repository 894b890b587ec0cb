"""`dflash bench`: drafter latency vs block size, end-to-end DFlash and its peers vs the target alone, and served
concurrency (N streamed users against vLLM, SGLang and the core's own loop).

The benchmarks live in the `dflash_bench` tool package (tools/bench), installed by `make setup`.
"""

from __future__ import annotations

import shlex
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
                        "dflash_fp16_weights,dflash_trimmed,dflash_chain,dflash_tree,dflash_tree_drafter,prompt_lookup,"
                        "assisted,"
                        "hf_generate; ar is always run); "
                        "default ar,dflash,dflash_drafter,"
                        "dflash_full,prompt_lookup, plus assisted where every pair has an assistant model beside its target")
    e.add_argument("--batch-sizes", type=flags.listed(flags.integer(1), "integers >= 1"), default=[1],
                   help="prompts decoded together, e.g. 1,4,16 (default 1)")
    e.add_argument("--repeats", type=flags.integer(1), default=1,
                   help="rounds of every method per batch, the fastest kept (steadier per-prompt ratios)")
    e.add_argument("--name", type=flags.file_stem, default="e2e")
    e.add_argument("--title", default="DFlash and its peers vs the target alone")
    s = _add_serve_parser(kinds)
    for sub in (d, e, s):
        sub.add_argument("--out", type=Path, default=Path("docs/results"), help="results directory")
        sub.add_argument("--force", action="store_true", help="write into an --out that holds other files")
        sub.add_argument("--threads", type=flags.integer(0), default=0)
    p.set_defaults(run=run)


def _add_serve_parser(kinds):
    s = kinds.add_parser("serve", help="N concurrent streamed users per engine (vLLM, SGLang plain and DFlash; the "
                                       "core's loop): throughput, speed per user, TTFT, acceptance, lossless outputs")
    s.add_argument("--engines", default="vllm-plain,vllm-dflash,core-plain,core",
                   help="engines started in turn (vllm-plain, vllm-dflash, vllm-dflash-kK: K drafts verified a step, "
                        "sglang-plain, sglang-dflash, core-plain, "
                        "core); '' with --url: only the server there (default %(default)s)")
    s.add_argument("--concurrency", type=flags.listed(flags.integer(1), "integers >= 1"), default=[1, 2, 4, 8, 16],
                   help="concurrent users, e.g. 1,2,4,8,16 (the default)")
    s.add_argument("--pair", default="demo", metavar="NAME|LABEL=TARGET:DRAFTER",
                   help="models/NAME/{target,drafter} beside the demo models (demo, smollm2), or directories")
    s.add_argument("--prompts-file", type=Path, default=None, help="JSONL prompts (default: the pair's heldout.jsonl)")
    s.add_argument("--prompts", type=flags.integer(1), default=16)
    s.add_argument("--max-new-tokens", type=flags.integer(1), default=64)
    s.add_argument("--temperature", type=flags.number(0.0), default=0.0, help="0: greedy, outputs compared")
    s.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                   help="served precision of every engine, and the reference's (fp32: greedy output is the target's)")
    s.add_argument("--url", default=None, help="also drive the OpenAI-compatible server already running here")
    s.add_argument("--api", choices=["vllm", "sglang", "openai"], default="vllm",
                   help="what the --url server is: which extra fields it gets and where its acceptance is read")
    s.add_argument("--label", default="url", help="the --url server's name in the report")
    s.add_argument("--name", type=flags.file_stem, default="serve")
    s.add_argument("--title", default="Served concurrency")
    return s


def _serve_pair(text: str, models_dir):
    """(ServePair, its default prompts file) from a models/ folder name or LABEL=TARGET:DRAFTER."""
    from dflash_bench.serve_bench import ServePair

    if "=" not in text:
        root = models_dir().parent / text
        if not (root / "target" / "config.json").is_file() or not (root / "drafter").is_dir():
            raise DFlashError(f"--pair {text}: {root} holds no target/ and drafter/; expected a folder of models/ "
                              "(demo, smollm2: `make real-model` builds its target) or LABEL=TARGET:DRAFTER.")
        return ServePair(text, root / "target", root / "drafter"), root / "heldout.jsonl"
    pair = _parse_pair(text)
    return ServePair(pair.label, pair.target, pair.drafter), pair.target.parent / "heldout.jsonl"


def _run_serve(args, command: str) -> Path:
    from dflash_bench import serve_bench
    from dflash_demo.paths import default_models_dir

    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    spec, heldout = _serve_pair(args.pair, default_models_dir)
    prompts = args.prompts_file or heldout
    guard_output(args.out, [prompts, spec.target, spec.drafter], force=args.force, is_own_state=_is_results_dir)
    return serve_bench.run(args.out, args.name, spec, prompts, engines=engines, concurrency=args.concurrency,
                           prompts=args.prompts, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                           url=args.url, api=args.api, label=args.label, dtype=args.dtype, command=command,
                           title=args.title)


def _pairs(args, models_dir) -> list:
    from dflash_bench.e2e import PairSpec

    if not args.pair:
        models = models_dir()
        return [PairSpec("demo", models / "target", models / "drafter")]
    return [_parse_pair(text) for text in args.pair]


def _parse_pair(text: str):
    """A PairSpec from LABEL=TARGET:DRAFTER[:BACKEND], both directories checked."""
    from dflash_bench.e2e import PairSpec

    label, _, rest = text.partition("=")
    parts = rest.split(":")
    if not label or len(parts) not in (2, 3):
        raise DFlashError(f"--pair {text!r} is malformed; expected LABEL=TARGET:DRAFTER[:BACKEND].")
    target, drafter = Path(parts[0]), Path(parts[1])
    missing = target if not (target / "config.json").is_file() else None if drafter.exists() else drafter
    if missing:
        raise DFlashError(f"--pair {label}: {missing} does not exist, expected a target model directory "
                          "(TARGET) and a drafter (DRAFTER).")
    return PairSpec(label, target, drafter, parts[2] if len(parts) == 3 else "torch")


def run(args) -> int:
    try:
        from dflash_bench import drafter_latency, e2e
        from dflash_demo.paths import default_models_dir
    except ImportError:
        raise DFlashError("benchmarks need the dflash-bench and dflash-demo tool packages: `make setup` installs "
                          "them (pip install -e tools/bench -e tools/demo).") from None
    apply_threads(args.threads)
    command = "dflash " + shlex.join(sys.argv[1:]) if sys.argv[0].endswith("dflash") else "dflash bench"
    if args.kind == "serve":
        try:
            path = _run_serve(args, command)
        except e2e.OutputMismatch as exc:  # an engine failed or broke losslessness: the report says which (exit 1)
            print(exc.report.read_text())
            print(f"dflash bench serve: error: {exc}", file=sys.stderr)
            return 1
    elif args.kind == "drafter":
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
