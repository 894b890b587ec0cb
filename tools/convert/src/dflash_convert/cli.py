"""The `dflash-convert` console script: a thin entry that imports the converter inside `main`.

The converter brings torch and transformers (seconds of start-up); importing them under `main`'s
handler makes a Ctrl-C during start-up one line and exit status 130, like a Ctrl-C at any other time.
The command itself is `command.run`.
"""

from __future__ import annotations

import sys

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C


def main(argv: list[str] | None = None) -> int:
    try:
        from .command import run

        return run(argv)
    except KeyboardInterrupt:  # staged output is already gone (atomic_directory cleans up on the way out)
        print("dflash-convert: interrupted; no partial output was left behind.", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
