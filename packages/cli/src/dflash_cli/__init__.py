"""The `dflash` command line: generate, demo, data, features, train, bench, serve.

A thin layer: each command turns its flags into explicit arguments of library functions
(`dflash_core`; the demo and benchmarks live in the `dflash_demo` and `dflash_bench` tool packages).
Bad input gives one line on stderr and exit status 2 (argparse's errors too); anything else that
goes wrong is a bug: one line and exit status 1, or its traceback with `--debug`.
"""

from __future__ import annotations

import argparse
import sys

from dflash_core.errors import DFlashError


class UsageError(DFlashError):
    """A flag argparse refused; the message already names the command."""


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block) and a `--debug` flag on every (sub)command."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                          help="show the traceback of an internal error")

    def error(self, message: str):
        raise UsageError(f"{self.prog}: error: {message}")


def build_parser() -> argparse.ArgumentParser:
    from dflash_cli import bench, data, demo, features, generate, serve, train

    parser = Parser(prog="dflash", description="DFlash block-diffusion speculative decoding")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (generate, demo, data, features, train, bench, serve):
        module.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    return _run(args, getattr(args, "debug", False))


def _run(args, debug: bool) -> int:
    name = " ".join(["dflash", args.command] + ([args.kind] if getattr(args, "kind", None) else []))
    try:
        return int(args.run(args) or 0)
    except DFlashError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file that cannot be read or written, a full disk
        where = f": {exc.filename}" if exc.filename else ""
        print(f"{name}: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{name}: interrupted (outputs are whole or absent; a resumable run continues where it stopped)",
              file=sys.stderr)
        return 130
    except Exception as exc:
        if debug:
            raise
        text = " ".join(str(exc).split())[:300]
        print(f"{name}: internal error: {type(exc).__name__}: {text} (re-run with --debug for the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
