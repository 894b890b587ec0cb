"""Value types of the `dflash` flags: every number is checked for type, range and finiteness where it enters.

Each type raises argparse's ArgumentTypeError, so a bad value is one line naming the flag, the value
and what was expected (`dflash demo: error: argument --summary-prompts: got '-3', expected an integer >= 0`).
"""

from __future__ import annotations

import argparse
import math
from typing import Callable, Sequence

SEED_LIMIT = 2**64


def _refuse(text: str, expected: str):
    raise argparse.ArgumentTypeError(f"got {text!r}, expected {expected}")


def _int_expected(minimum: int | None, maximum: int | None) -> str:
    if maximum is not None and minimum is not None:
        return f"an integer in [{minimum}, {maximum}]"
    return "an integer" + (f" >= {minimum}" if minimum is not None else "")


def integer(minimum: int | None = None, maximum: int | None = None) -> Callable[[str], int]:
    """An int flag within [minimum, maximum]."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            _refuse(text, _int_expected(minimum, maximum))
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            _refuse(text, _int_expected(minimum, maximum))
        return value

    parse.__name__ = "integer"
    return parse


def number(minimum: float | None = None, maximum: float | None = None, *, above: float | None = None,
           at_most: bool = True) -> Callable[[str], float]:
    """A finite float flag: >= minimum (or > above), <= maximum (< maximum when not at_most)."""
    parts = ["a finite number"]
    if above is not None:
        parts.append(f"> {above:g}")
    if minimum is not None:
        parts.append(f">= {minimum:g}")
    if maximum is not None:
        parts.append(f"{'<=' if at_most else '<'} {maximum:g}")
    expected = " ".join(parts[:1]) + (" " + " and ".join(parts[1:]) if len(parts) > 1 else "")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            _refuse(text, expected)
        ok = math.isfinite(value) and (above is None or value > above) and (minimum is None or value >= minimum)
        if maximum is not None:
            ok = ok and (value <= maximum if at_most else value < maximum)
        if not ok:
            _refuse(text, expected)
        return value

    parse.__name__ = "number"
    return parse


def seed(text: str) -> int:
    """A random seed: an integer in [0, 2^64) (what torch.Generator.manual_seed takes)."""
    try:
        return integer(0, SEED_LIMIT - 1)(text)
    except argparse.ArgumentTypeError:
        _refuse(text, "an integer in [0, 2^64)")


def top_p(text: str) -> float:
    return number(above=0.0, maximum=1.0)(text)


def listed(item: Callable[[str], object], what: str) -> Callable[[str], list]:
    """A comma-separated list of `item` values (at least one)."""

    def parse(text: str) -> list:
        parts = [p.strip() for p in text.split(",")]
        if not text.strip() or any(not p for p in parts):
            _refuse(text, f"a comma-separated list of {what}")
        values = []
        for p in parts:
            try:
                values.append(item(p))
            except argparse.ArgumentTypeError:
                _refuse(text, f"a comma-separated list of {what} ({p!r} is not one)")
        return values

    parse.__name__ = "list"
    return parse


def one_of(choices: Sequence[str]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            _refuse(text, f"one of {', '.join(choices)}")
        return text

    return parse


def device(text: str) -> str:
    """A torch device that exists on this machine (cpu, cuda, cuda:N, mps)."""
    from dflash_core.devices import check_device
    from dflash_core.errors import DFlashError

    try:
        return str(check_device(text))
    except DFlashError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def file_stem(text: str) -> str:
    """A plain file name without folders (letters, digits, '.', '_', '-'): results are written as OUT/NAME.*."""
    if not text or text.startswith(".") or any(not (c.isalnum() or c in "._-") for c in text):
        _refuse(text, "a plain name of letters, digits, '.', '_' or '-' (no folders)")
    return text
