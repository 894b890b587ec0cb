"""`dflash demo`: the embedded default — stream a held-out completion, report tau and speedup.

The demo itself lives in the `dflash_demo` tool package (tools/demo), installed by `make setup`.
"""

from __future__ import annotations

from pathlib import Path

from dflash_core.errors import DFlashError

from dflash_cli import flags
from dflash_cli.common import add_draft_length_arg, add_runtime_args, apply_threads, tuning_for


def add_parser(commands) -> None:
    p = commands.add_parser("demo", help="stream a held-out completion with the bundled demo models")
    p.add_argument("--models", type=Path, default=None, help="demo models directory (target/, drafter/, heldout.jsonl)")
    p.add_argument("--prompt-index", type=flags.integer(0), default=None,
                   help="which held-out prompt to complete (default: the bundled set's demo prompt, dflash_demo.session.DEMO_PROMPT)")
    p.add_argument("--max-new-tokens", type=flags.integer(1), default=256)
    p.add_argument("--temperature", type=flags.number(0.0), default=0.0)
    p.add_argument("--top-p", type=flags.top_p, default=1.0)
    p.add_argument("--top-k", type=flags.integer(0), default=0)
    p.add_argument("--seed", type=flags.seed, default=0)
    p.add_argument("--summary-prompts", type=flags.integer(0), default=24,
                   help="also measure tau and speedup over the first N held-out prompts (0: skip)")
    add_draft_length_arg(p)
    add_runtime_args(p, default_dtype="auto", allow_auto=True)
    p.set_defaults(run=run)


def run(args) -> int:
    try:
        from dflash_demo.paths import default_models_dir
        from dflash_demo.session import DemoRequest, run_demo
    except ImportError:
        raise DFlashError("the demo needs the dflash-demo tool package: `make setup` installs it "
                          "(pip install -e tools/demo -e tools/bench).") from None
    apply_threads(args.threads)
    request = DemoRequest(models=args.models or default_models_dir(),
                          prompt_index=args.prompt_index,
                          max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                          top_k=args.top_k, seed=args.seed, summary_prompts=args.summary_prompts, dtype=args.dtype,
                          device=args.device, draft_length=args.draft_length, context_lookup=args.context_lookup,
                          tree=args.tree,
                          tuning=tuning_for(args))
    run_demo(request)
    return 0
