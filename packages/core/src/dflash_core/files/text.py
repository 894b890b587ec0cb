"""Reading text, JSON and JSONL inputs: every failure is one sentence naming the file (and line).

Binary content (a NUL byte) and invalid UTF-8 are refused rather than decoded into garbage prompts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

from dflash_core.errors import DataError, DFlashError


def _refuse(error: type[DFlashError], where: str, data: bytes) -> None:
    nul = data.find(b"\0")
    if nul >= 0:
        raise error(f"{where} holds binary data (a NUL byte at offset {nul}), expected UTF-8 text.")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{where} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start} cannot be "
                    "decoded), expected UTF-8 text.") from None


def decode_text(data: bytes, where: str, error: type[DFlashError] = DataError) -> str:
    """`data` as text; binary data or invalid UTF-8 raise `error` naming `where`."""
    _refuse(error, where, data)
    return data.decode("utf-8")


def read_text_file(path: str | os.PathLike, what: str = "", error: type[DFlashError] = DataError) -> str:
    """A whole UTF-8 text file; `what` (a flag such as --prompt-file) prefixes the path in messages."""
    path = Path(path)
    return decode_text(path.read_bytes(), f"{what} {path}".strip(), error)


def read_lines(path: str | os.PathLike, error: type[DFlashError] = DataError) -> Iterator[tuple[int, str]]:
    """(line number, text) of every line of a UTF-8 text file; a bad line is named as path:line."""
    path = Path(path)
    for number, raw in enumerate(path.read_bytes().splitlines(), start=1):
        yield number, decode_text(raw, f"{path}:{number}", error)


def read_json_object(path: str | os.PathLike, error: type[DFlashError] = DataError, expected: str = "") -> dict:
    """A JSON file holding an object; not UTF-8, not JSON or not an object raise `error` naming the file."""
    path = Path(path)
    text = decode_text(path.read_bytes(), str(path), error)
    hint = f"; expected {expected}" if expected else ""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}){hint}.") from None
    if not isinstance(value, dict):
        what = f" ({expected})" if expected else ""
        raise error(f"{path} holds a JSON {json_type(value)}, expected an object{what}.")
    return value


def json_type(value: object) -> str:
    """The JSON name of a parsed value's type (object, array, string, number, boolean, null)."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
