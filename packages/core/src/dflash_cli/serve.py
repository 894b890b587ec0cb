"""`dflash serve --engine sglang`: serve a target and its drafter through SGLang's own DFLASH server.

A thin layer: the engine plugin (`dflash_sglang.serve`, imported only when this command runs) finds
the SGLang environment, converts the drafter when needed, launches and supervises the server.
"""

from __future__ import annotations

import argparse
import sys

from dflash_core.errors import DFlashError

from . import flags


def add_parser(commands) -> None:
    p = commands.add_parser("serve", help="serve a target and its drafter with SGLang's native DFLASH "
                                          "(HTTP, OpenAI API)")
    p.add_argument("--engine", choices=["sglang"], default="sglang", help="serving engine (default sglang)")
    p.add_argument("--target", required=True, help="Hugging Face target model directory (with tokenizer)")
    p.add_argument("--drafter", required=True,
                   help="drafter directory: published format (converted into runs/sglang-serve/ when needed) "
                        "or a dflash-convert --to sglang output")
    p.add_argument("--port", type=flags.integer(1, 65535), default=30000)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: cuda where the SGLang environment sees a GPU, else cpu "
                        "(patched, see docs/sglang-cpu.md)")
    p.add_argument("--dtype", choices=["auto", "fp32", "bf16", "fp16"], default="auto",
                   help="served precision (auto: fp32 on cpu, bf16 on cuda)")
    p.add_argument("--print-command", action="store_true",
                   help="print the launch command (with its environment) and exit")
    p.add_argument("--sglang-python", default=None,
                   help="python of the SGLang environment "
                        "(default: .venv-sglang of the repository, or $DFLASH_SGLANG_PYTHON)")
    p.add_argument("--timeout", type=flags.number(above=0.0), default=900.0, help="seconds to wait for /health")
    p.add_argument("sglang_args", nargs=argparse.REMAINDER, metavar="-- SGLANG_ARGS",
                   help="further arguments for sglang.launch_server, after --")
    p.set_defaults(run=run)


def run(args) -> int:
    try:
        from dflash_sglang.serve import serve
        from dflash_sglang.server import ServerDied
    except ImportError:
        raise DFlashError("dflash serve needs the dflash-sglang plugin package: `make setup` installs it "
                          "(pip install -e packages/sglang_plugin).") from None
    extra = args.sglang_args[1:] if args.sglang_args[:1] == ["--"] else args.sglang_args
    try:
        return serve(args.target, args.drafter, port=args.port, device=args.device, dtype=args.dtype,
                     print_command=args.print_command, sglang_python=args.sglang_python, extra=extra,
                     timeout=args.timeout)
    except ServerDied as exc:
        print(f"dflash serve: error: {exc}", file=sys.stderr)
        return 1
