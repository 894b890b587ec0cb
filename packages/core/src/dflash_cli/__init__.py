"""The `dflash` command line: generate, demo, data, train, bench.

A thin layer: each command turns its flags into explicit arguments of library functions
(`dflash_core`; the demo and benchmarks live in the `dflash_demo` and `dflash_bench` tool packages).
Every command turns bad input into one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys

from dflash_core.errors import DFlashError


def build_parser() -> argparse.ArgumentParser:
    from . import bench, data, demo, generate, train

    parser = argparse.ArgumentParser(prog="dflash", description="DFlash block-diffusion speculative decoding")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (generate, demo, data, train, bench):
        module.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except DFlashError as exc:
        print(f"dflash {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError) as exc:
        print(f"dflash {args.command}: error: {exc.strerror or exc}: {exc.filename}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"dflash {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
