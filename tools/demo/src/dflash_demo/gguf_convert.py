"""A GGUF model as a plain Hugging Face model, converted once into a cache and copied from there.

Shared by `make real-model` (dflash_demo.smollm2) and `make code-model` (dflash_demo.qwen_coder).
Hugging Face transformers reads a GGUF file (with the `gguf` package), dequantised, but refuses
`save_pretrained` on it (it counts as quantised): the weights are moved into a plain model built from
the same config (without a quantization_config; every key must match) and saved as safetensors, with
the tokenizer and chat template. `dflash_source.json` records where the weights came from (the GGUF
file's sha256 and the dtype): a directory made from another file or dtype is converted again.

The GGUF file is read straight in the saved dtype (transformers casts each tensor right after
dequantising it, the one rounding a cast after an fp32 load would make) and the plain model is built in
that dtype: the peak is about two copies of the model in that dtype. Every output is written atomically.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from dflash_core.errors import DFlashError, OutputError
from dflash_core.files.atomic import atomic_directory, write_json

SOURCE_FILE = "dflash_source.json"


class ConversionError(DFlashError):
    """The GGUF file could not be found, read or turned into a plain Hugging Face model."""


def read_source(directory: Path) -> dict | None:
    try:
        return json.loads((directory / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return None


def is_fresh(directory: Path, record: dict) -> bool:
    return (directory / "config.json").is_file() and read_source(directory) == record


def load_gguf(gguf: Path, dtype: torch.dtype, make_target: str):
    """(model, tokenizer) as transformers reads the GGUF file, dequantised into `dtype`."""
    for needed in ("gguf", "accelerate"):
        if importlib.util.find_spec(needed) is None:
            raise ConversionError(f"reading {gguf.name} needs the `{needed}` package: install it "
                                  f"(`{make_target}` installs gguf and accelerate).")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=dtype)
    except Exception as exc:  # transformers and gguf raise many types; one line naming the file
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConversionError(f"cannot read {gguf}: {first}") from None
    return model, tokenizer


def plain_model(loaded, dtype: torch.dtype):
    """The GGUF-loaded model's weights in a plain model of the same config (no quantization_config)."""
    from transformers import AutoModelForCausalLM

    config = loaded.config
    config.__dict__.pop("quantization_config", None)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    result = model.load_state_dict(loaded.state_dict(), strict=False)  # copies, casting where dtypes differ
    if result.missing_keys or result.unexpected_keys:
        raise ConversionError(f"the GGUF weights do not fit a plain {type(model).__name__}: missing "
                              f"{result.missing_keys[:3]}, unexpected {result.unexpected_keys[:3]}.")
    if loaded.config.tie_word_embeddings:
        model.tie_weights()
    model.generation_config = loaded.generation_config
    return model.to(dtype).eval()


def convert_gguf(gguf: Path, out: Path, dtype: torch.dtype, record: dict, *, model_name: str, duration: str,
                 make_target: str, check: Callable[[object], None] | None = None) -> None:
    """Write `out` (a new directory): safetensors weights in `dtype`, config, tokenizer with chat template,
    and `record` as dflash_source.json. `check(config)` may refuse the converted config (ConversionError)."""
    started = time.perf_counter()
    print(f"converting {gguf.name} (dequantising; {duration}) ...", file=sys.stderr)
    loaded, tokenizer = load_gguf(gguf, dtype, make_target)
    if not tokenizer.chat_template:
        raise ConversionError(f"{gguf.name} carries no chat template, expected {model_name}'s.")
    model = plain_model(loaded, dtype)
    del loaded
    if check is not None:
        check(model.config)
    with atomic_directory(out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        write_json(tmp / SOURCE_FILE, record)
        mask = os.umask(0)
        os.umask(mask)
        for item in tmp.iterdir():  # the weights writer leaves its temporary file's 0600
            item.chmod(0o666 & ~mask)
    print(f"converted in {time.perf_counter() - started:.0f}s: {out}", file=sys.stderr)


def install_converted(out: Path, cache: Path, record: dict, convert: Callable[[Path], None], what: str) -> str:
    """Make `out` hold the conversion `record` describes, from `cache`, calling `convert(cache)` first if the
    cache is not fresh. Returns "present", "copied" or "converted".

    An `out` or cache made from another source or dtype is replaced; one that is not a conversion of ours
    (no dflash_source.json) is refused with OutputError naming `what`.
    """
    if is_fresh(out, record):
        return "present"
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and read_source(out) is None)):
        raise OutputError(f"{out} holds something other than a converted {what}; "
                          "move it away or give another --out.")
    done = "copied"
    if not is_fresh(cache, record):
        if cache.exists() and read_source(cache) is None:
            raise OutputError(f"the cache {cache} holds something other than a converted {what}; "
                              "move it away or give another --cache.")
        if cache.exists():
            shutil.rmtree(cache)  # our own conversion, made from another GGUF file or dtype
        convert(cache)
        done = "converted"
    if cache.resolve() != out.resolve():
        with atomic_directory(out, overwrite=True) as tmp:
            for item in sorted(cache.iterdir()):
                shutil.copy2(item, tmp / item.name)
    return done
