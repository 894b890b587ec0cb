"""`dflash serve --engine {sglang,vllm}`: serve a target and its drafter through the engine's own DFlash server.

A thin layer: the engine plugin (`dflash_sglang.serve` or `dflash_vllm.serve`, imported only when
this command runs) finds the engine's environment, converts the drafter when needed, launches and
supervises the server.
"""

from __future__ import annotations

import argparse
import sys

from dflash_core.errors import DFlashError

from dflash_cli import flags


def add_parser(commands) -> None:
    p = commands.add_parser("serve", help="serve a target and its drafter with SGLang's or vLLM's native DFlash "
                                          "(HTTP, OpenAI API)")
    p.add_argument("--engine", choices=["sglang", "vllm"], default="sglang", help="serving engine (default sglang)")
    p.add_argument("--target", required=True, help="Hugging Face target model directory (with tokenizer)")
    p.add_argument("--drafter", required=True,
                   help="drafter directory: published format (converted into runs/ENGINE-serve/ when needed) "
                        "or a dflash-convert --to ENGINE output")
    p.add_argument("--port", type=flags.integer(1, 65535), default=None, help="default 30000 (sglang), 8000 (vllm)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: cuda where the engine's environment sees a GPU, else cpu "
                        "(see docs/sglang-cpu.md, docs/vllm-cpu.md)")
    p.add_argument("--dtype", choices=["auto", "fp32", "bf16", "fp16"], default="auto",
                   help="served precision (auto: fp32 on cpu, bf16 on cuda)")
    p.add_argument("--print-command", action="store_true",
                   help="print the launch command (with its environment) and exit")
    p.add_argument("--sglang-python", default=None,
                   help="python of the SGLang environment "
                        "(default: .venv-sglang of the repository, or $DFLASH_SGLANG_PYTHON)")
    p.add_argument("--vllm-python", default=None,
                   help="python of the vLLM environment (default: .venv-vllm of the repository, or $DFLASH_VLLM_PYTHON)")
    p.add_argument("--draft-length", type=flags.integer(1), default=None, metavar="K",
                   help="vllm: verify the first K of the block's drafts each step (default: 3 on a CPU, the whole "
                        "block on a GPU; docs/benchmarks.md, 'Served concurrency')")
    p.add_argument("--timeout", type=flags.number(above=0.0), default=900.0, help="seconds to wait for /health")
    p.add_argument("engine_args", nargs=argparse.REMAINDER, metavar="-- ENGINE_ARGS",
                   help="further arguments for the engine's server (sglang.launch_server, vLLM's api_server), after --")
    p.set_defaults(run=run)


def run(args) -> int:
    try:
        from dflash_serving.supervise import ServerDied

        if args.engine == "vllm":
            from dflash_vllm.serve import serve
        else:
            from dflash_sglang.serve import serve
    except ImportError:
        raise DFlashError(f"dflash serve --engine {args.engine} needs the dflash-{args.engine} plugin package: "
                          f"`make setup` installs it (pip install -e packages/{args.engine}_plugin).") from None
    extra = args.engine_args[1:] if args.engine_args[:1] == ["--"] else args.engine_args
    engine_python = {"vllm_python": args.vllm_python} if args.engine == "vllm" else {"sglang_python": args.sglang_python}
    port = args.port or (8000 if args.engine == "vllm" else 30000)
    if args.draft_length is not None:
        if args.engine != "vllm":
            raise DFlashError("--draft-length is for --engine vllm; SGLang's DFLASH verifies the drafter's whole block.")
        engine_python["draft_length"] = args.draft_length
    try:
        return serve(args.target, args.drafter, port=port, device=args.device, dtype=args.dtype,
                     print_command=args.print_command, extra=extra, timeout=args.timeout, **engine_python)
    except ServerDied as exc:
        print(f"dflash serve: error: {exc}", file=sys.stderr)
        return 1
