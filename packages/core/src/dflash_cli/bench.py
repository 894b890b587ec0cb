"""`dflash bench`: drafter latency vs block size, and end-to-end DFlash vs the target alone.

The benchmarks live in the `dflash_bench` tool package (tools/bench), installed by `make setup`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dflash_core.errors import DFlashError

from .common import apply_threads


def add_parser(commands) -> None:
    p = commands.add_parser("bench", help="benchmarks (JSON + Markdown table + plot)")
    kinds = p.add_subparsers(dest="kind", required=True, metavar="KIND")
    d = kinds.add_parser("drafter", help="drafter forward latency at several block sizes")
    d.add_argument("--hidden", type=int, default=1024)
    d.add_argument("--context", type=int, default=512)
    d.add_argument("--layers", default="1,5")
    d.add_argument("--blocks", default="4,8,16,32")
    d.add_argument("--dtypes", default="fp32,bf16")
    d.add_argument("--repeats", type=int, default=30)
    e = kinds.add_parser("e2e", help="DFlash vs the target alone on held-out prompts")
    e.add_argument("--pair", action="append", default=[], metavar="LABEL=TARGET:DRAFTER[:BACKEND]",
                   help="a target/drafter pair to measure (repeatable; default: the demo pair)")
    e.add_argument("--prompts-file", type=Path, default=None, help="JSONL prompts (default: demo held-out)")
    e.add_argument("--prompts", type=int, default=16)
    e.add_argument("--max-new-tokens", type=int, default=256)
    e.add_argument("--dtypes", default="bf16")
    e.add_argument("--temperatures", default="0")
    e.add_argument("--device", default="cpu", help="torch device of target and drafter")
    e.add_argument("--name", default="e2e")
    e.add_argument("--title", default="DFlash vs the target alone")
    for sub in (d, e):
        sub.add_argument("--out", type=Path, default=Path("docs/results"))
        sub.add_argument("--threads", type=int, default=0)
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
        pairs.append(PairSpec(label, Path(parts[0]), Path(parts[1]), parts[2] if len(parts) == 3 else "torch"))
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
        path = drafter_latency.run(args.out, hidden=args.hidden, context=args.context,
                                   layers=[int(x) for x in args.layers.split(",")],
                                   blocks=[int(x) for x in args.blocks.split(",")], dtypes=args.dtypes.split(","),
                                   repeats=args.repeats, command=command)
    else:
        prompts = args.prompts_file or default_models_dir() / "heldout.jsonl"
        path = e2e.run(args.out, _pairs(args, default_models_dir), prompts, prompts=args.prompts,
                       max_new_tokens=args.max_new_tokens, dtypes=args.dtypes.split(","),
                       temperatures=[float(t) for t in args.temperatures.split(",")], device=args.device,
                       name=args.name, title=args.title, command=command)
    print(path.read_text())
    return 0
