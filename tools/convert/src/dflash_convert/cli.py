"""`dflash-convert` command line (targets are added by the converter modules)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("dflash-convert: not implemented yet", file=sys.stderr)
    return 2
