"""`dflash data` (filled in by the training / benchmark modules)."""

from __future__ import annotations


def add_parser(commands) -> None:
    p = commands.add_parser("data", help="(not yet available)")
    p.set_defaults(run=run)


def run(args) -> int:
    from ..errors import DFlashError

    raise DFlashError("this command is not available yet.")
