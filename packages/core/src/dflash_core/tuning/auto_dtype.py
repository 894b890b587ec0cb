"""`dtype='auto'`: pick bf16 only where this machine really runs it faster than fp32.

On CUDA bf16 is native and always chosen (no probe). On a CPU it depends on the silicon: with
AMX or AVX512-BF16 bf16 matmuls run in hardware and beat fp32; with AVX2 only they are emulated
and bf16 is often several times slower. Flags alone do not settle it (oneDNN kernels, thread
count and the model's shapes all matter), so we time it: a copy of the target in each dtype runs
one forward over 1 new token and one over `block_size` new tokens (the decode and the verify
shapes) after a cached context, and bf16 wins only when it is at least 10% faster on both.

The result can be cached per (machine, model config, block size) in the caller's cache directory
(`Tuning.cached()`: `$DFLASH_CACHE_DIR` | `$XDG_CACHE_HOME/dflash` | `~/.cache/dflash`), file `dtype_probe.json`.
Cost: on the demo target (models/demo/target, 12.6M params, Qwen3, block 16), with one torch
thread on a shared 2-core AMD EPYC (AVX2 only, no bf16 hardware), both probes together took
1.2-2.0 s (deep copy and prefill included); bf16 was 1.5-2.4x slower over 16 tokens (0.7-1.2x
over one token), so fp32 was chosen. On a loaded machine the timings, and so the cached choice,
can be wrong: delete `dtype_probe.json` to measure again.

Training is another workload (`workload="train"`): its matmuls run over thousands of rows, where bf16 hardware
pays even when one decode token does not. On a 2-core Intel Xeon with AMX the demo target's decode probe chose
fp32 (bf16 1.3x slower over one token) while a training step of the demo recipe took 1.6 s in bf16 against 2.3 s
in fp32. So training is probed with one forward over a training-sized batch (`TRAIN_PROBE_SHAPE`, no cache) and
gets bf16 where that is at least 10% faster, cached under its own key. Generating training data in batches
(`dflash data`, `--batch-size` >= `BATCHED_ROWS`) is probed the same way: each step's matmuls run over a row per
sequence, plus the prompts' prefill. With SmolLM2-135M on a 2-core AMD EPYC with AVX512-BF16 the decode probe
chose fp32 (bf16 1.2x slower over one token) where 64 chats x 256 tokens were generated in 49 s in bf16 against
85 s in fp32, and the training probe says bf16 (0.51x); on an AVX2-only CPU both say fp32.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
from transformers import DynamicCache

from dflash_core.devices import cpu_facts, sync_device
from dflash_core.dtypes import resolve_dtype, short_name
from dflash_core.target.adapter import cache_argument
from dflash_core.kernels.prepacked_linear import onednn_bf16_kernels, prepack_linears
from dflash_core.target.cache import truncate_cache

CACHE_FILE = "dtype_probe.json"
BF16_MARGIN = 0.9  # bf16 must take <= 0.9x the fp32 time on both shapes to be chosen
PROBED = ("fp32", "bf16")  # the candidates, by their short names in `dtypes`
_VOLATILE = {"torch_dtype", "dtype", "_name_or_path", "transformers_version", "_commit_hash"}

TRAIN_PROBE_SHAPE = (2, 256)  # [sequences, tokens] of the training probe: 512 rows per matmul, as a batch does
WORKLOADS = ("decode", "train")
BATCHED_ROWS = 8  # `dflash data` batches of at least this many sequences are probed as "train", not "decode"

Probe = Callable[[torch.nn.Module, torch.dtype, int], dict]


# ---- measuring ----------------------------------------------------------------------------------
@torch.inference_mode()
def probe_forward_costs(model: torch.nn.Module, dtype: torch.dtype, block_size: int, *, context: int = 64,
                        repeats: int = 5) -> dict:
    """Seconds of a forward over 1 and over `block_size` new tokens after `context` cached ones.

    Runs on a copy of the Hugging Face causal LM `model` cast to `dtype` (the original is untouched).
    Each time is the fastest of `repeats` after two warm-up runs, not the median: other work on
    the machine only ever adds time, so the fastest run is the best estimate of the hardware.
    Returns {"dtype": "fp32"|"bf16", "one_token_s", "block_s", "block_size"}.
    """
    if block_size < 1 or context < 1 or repeats < 1:
        raise ValueError(f"block_size, context and repeats must be >= 1, got {block_size}, {context}, {repeats}")
    twin, ids = _twin_and_ids(model, dtype, (1, context + block_size))
    if twin is not model:  # a cast copy: give it the weights decoding would read (`load_pair` prepacks bf16 alike)
        prepack_linears(twin)
    device = ids.device
    cache = DynamicCache()
    cache_kw = cache_argument(twin)
    twin(input_ids=ids[:, :context], use_cache=True, **{cache_kw: cache})  # prefill once

    def forward(new: int) -> float:
        started = time.perf_counter()
        twin(input_ids=ids[:, context : context + new], use_cache=True, **{cache_kw: cache})
        sync_device(device)
        elapsed = time.perf_counter() - started
        truncate_cache(cache, context)  # back to the prefilled context for the next forward
        return elapsed

    for _ in range(2):  # warm-up: allocator, oneDNN kernel selection, lazy inits
        forward(1)
        forward(block_size)
    one = [forward(1) for _ in range(repeats)]
    block = [forward(block_size) for _ in range(repeats)]
    del twin, cache
    return {"dtype": short_name(dtype), "one_token_s": min(one), "block_s": min(block),
            "block_size": block_size}


def _twin_and_ids(model: torch.nn.Module, dtype: torch.dtype, shape: tuple[int, int]):
    """(the model in `dtype` for probing, seeded random token ids of `shape` on its device). A forward changes
    nothing, so a model already in `dtype` (and in eval mode) is used as is; otherwise a cast copy."""
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"cannot probe dtype {dtype}: expected torch.float32 or torch.bfloat16")
    same = not model.training and next(model.parameters()).dtype == dtype
    twin = model if same else copy.deepcopy(model).to(dtype).eval()
    vocab = twin.get_input_embeddings().weight.shape[0]
    ids = torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(0))
    return twin, ids.to(next(twin.parameters()).device)


@torch.inference_mode()
def probe_training_costs(model: torch.nn.Module, dtype: torch.dtype, block_size: int, *,
                         shape: tuple[int, int] = TRAIN_PROBE_SHAPE, repeats: int = 2) -> dict:
    """Seconds of one forward over a training-sized batch `shape` [sequences, tokens], no cache, in `dtype`.

    A copy of `model` is cast (the original is untouched); fastest of `repeats` after one warm-up. `block_size`
    is not used (the signature is `Probe`'s). Returns {"dtype", "train_s", "tokens"}.
    """
    twin, ids = _twin_and_ids(model, dtype, shape)
    device = ids.device

    def forward() -> float:
        started = time.perf_counter()
        twin(input_ids=ids, use_cache=False)
        sync_device(device)
        return time.perf_counter() - started

    forward()  # warm-up
    seconds = min(forward() for _ in range(repeats))
    del twin
    return {"dtype": short_name(dtype), "train_s": seconds, "tokens": shape[0] * shape[1]}


# ---- choosing -----------------------------------------------------------------------------------
def choose_dtype(costs_by_dtype: dict[str, dict], block_size: int, *, machine: str = "this machine") -> tuple[str, str]:
    """("fp32"|"bf16", one human line) from probe results keyed "fp32" and "bf16". Pure.

    bf16 is chosen only when it takes <= BF16_MARGIN of the fp32 time over 1 token AND over
    `block_size` tokens; `machine` names where that was measured, for the reason line.
    """
    fp32, bf16 = costs_by_dtype.get("fp32"), costs_by_dtype.get("bf16")
    if not fp32 or not bf16:
        return "fp32", f"fp32: bf16 was not measured on {machine}"
    one = bf16["one_token_s"] / fp32["one_token_s"]
    block = bf16["block_s"] / fp32["block_s"]
    if one <= BF16_MARGIN and block <= BF16_MARGIN:
        return "bf16", f"bf16: one token {one:.2f}x and {block_size} tokens {block:.2f}x the fp32 time on {machine}"
    worst, shape = (one, "one token") if one >= block else (block, f"{block_size} tokens")
    if worst > 1.0:
        other = block if shape == "one token" else one
        other_shape = f"{block_size} tokens" if shape == "one token" else "one token"
        return "fp32", f"fp32: bf16 is {worst:.1f}x slower over {shape} ({other_shape} {other:.2f}x) on {machine}"
    return "fp32", (f"fp32: bf16 saves too little on {machine} (one token {one:.2f}x, {block_size} tokens "
                    f"{block:.2f}x the fp32 time; needs <= {BF16_MARGIN}x on both)")


def choose_training_dtype(costs_by_dtype: dict[str, dict], block_size: int = 0, *,
                          machine: str = "this machine") -> tuple[str, str]:
    """("fp32"|"bf16", one human line) from `probe_training_costs` results keyed "fp32" and "bf16". Pure.

    bf16 when its training-sized forward takes <= BF16_MARGIN of the fp32 time. (`block_size`: unused, the
    signature is `choose_dtype`'s.)"""
    fp32, bf16 = costs_by_dtype.get("fp32"), costs_by_dtype.get("bf16")
    if not fp32 or not bf16:
        return "fp32", f"fp32 for batches: bf16 was not measured on {machine}"
    ratio, tokens = bf16["train_s"] / fp32["train_s"], fp32["tokens"]
    if ratio <= BF16_MARGIN:
        return "bf16", f"bf16 for batches: a {tokens}-token forward takes {ratio:.2f}x the fp32 time on {machine}"
    return "fp32", (f"fp32 for batches: bf16 takes {ratio:.2f}x the fp32 time over a {tokens}-token forward on "
                    f"{machine} (needs <= {BF16_MARGIN}x)")


# ---- keys ----------------------------------------------------------------------------------------
def describe_machine(device: torch.device | str = "cpu") -> str:
    """Short words for reason lines: 'this CPU (AMD EPYC, avx2 only: bf16 matmuls are emulated)'."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"CUDA device {torch.cuda.get_device_name(device)}"
    name, isa = cpu_facts()
    bf16_flags = [f for f in isa if f.endswith("bf16")]  # amx_bf16, avx512_bf16
    if bf16_flags and not onednn_bf16_kernels():  # oneDNN capped below them (ONEDNN_MAX_CPU_ISA)
        return f"this CPU ({name}, but oneDNN has no bf16 kernels here: bf16 matmuls are emulated)"
    if bf16_flags:
        return f"this CPU ({name}, {', '.join(bf16_flags)})"
    if isa:
        return f"this CPU ({name}, {isa[0]} only: bf16 matmuls are emulated)"
    return f"this CPU ({name})"


def machine_key(device: torch.device | str = "cpu") -> str:
    """What a timing depends on besides the model: CPU model + ISA flags, the kernels torch runs on them (capped
    by ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA where set), torch, threads (or the GPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda={torch.cuda.get_device_name(device)}|torch={torch.__version__}"
    name, isa = cpu_facts()
    return (f"cpu={name}|isa={','.join(isa) or 'none'}|kernels={cpu_kernels()}|torch={torch.__version__}"
            f"|threads={torch.get_num_threads()}")


def cpu_kernels() -> str:
    """The vector ISA of torch's own CPU kernels, and whether oneDNN has bf16 kernels, e.g. "AVX512,onednn-bf16"."""
    return f"{torch.backends.cpu.get_cpu_capability()},{'onednn-bf16' if onednn_bf16_kernels() else 'no-onednn-bf16'}"


def model_key(model: torch.nn.Module, block_size: int) -> str:
    """sha256 of the model's config (volatile fields dropped, attention kernel kept) and the block size."""
    config = _stable(model.config.to_dict())
    config["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    blob = json.dumps({"config": config, "block_size": block_size}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _stable(config: dict) -> dict:
    return {k: _stable(v) if isinstance(v, dict) else v for k, v in config.items() if k not in _VOLATILE}


# ---- cache file ----------------------------------------------------------------------------------
def default_cache_dir() -> Path:
    if os.environ.get("DFLASH_CACHE_DIR"):
        return Path(os.environ["DFLASH_CACHE_DIR"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "dflash"
    return Path.home() / ".cache" / "dflash"


def read_cache(cache_dir: Path, filename: str = CACHE_FILE) -> dict:
    """key -> entry; an unreadable or corrupt file reads as empty (it is re-measured and overwritten)."""
    try:
        data = json.loads((cache_dir / filename).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_cache(cache_dir: Path, data: dict, filename: str = CACHE_FILE) -> None:
    """Atomic: a temp file in the same directory, then os.replace. A cache that cannot be written is skipped."""
    temp = None
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=cache_dir, prefix=filename, suffix=".tmp")
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=1, sort_keys=True)
        os.replace(temp, cache_dir / filename)
    except OSError:
        if temp is not None and os.path.exists(temp):
            os.unlink(temp)


def _slower(a: dict, b: dict) -> dict:
    """Per shape (each "..._s" time), the slower of two probes of one dtype (bf16 must win against fp32's worst
    case too)."""
    return {**a, **{key: max(a[key], b[key]) for key in a if key.endswith("_s")}}


def _valid_entry(entry) -> bool:
    return isinstance(entry, dict) and entry.get("choice") in PROBED and isinstance(entry.get("reason"), str)


# ---- public entry ---------------------------------------------------------------------------------
def resolve_auto_dtype(model: torch.nn.Module, block_size: int, *, device: torch.device | str,
                       probe: Probe | None = None, cache_dir: str | os.PathLike | None = None,
                       workload: str = "decode") -> tuple[torch.dtype, str]:
    """(dtype, one reason line) for `dtype='auto'` on a Hugging Face causal LM.

    CUDA: bf16, no probe. Elsewhere: the choice cached in `cache_dir` for this machine, model, block size and
    workload (reason ends " (cached)"), or probe fp32 and bf16 now, choose, and cache it there (without a
    `cache_dir`: probe, nothing read or written). `workload` "decode" times the
    decode and verify shapes (`probe_forward_costs`), "train" a training-sized forward (`probe_training_costs`).
    `probe(model, dtype, block_size) -> costs` replaces the workload's probe (tests inject timings through it).
    """
    if workload not in WORKLOADS:
        raise ValueError(f"workload {workload!r} is not one of {', '.join(WORKLOADS)}")
    device = torch.device(device)
    if device.type == "cuda":
        return torch.bfloat16, f"bf16: {describe_machine(device)} supports it"
    key = f"{machine_key(device)}|model={model_key(model, block_size)[:16]}|block={block_size}"
    # decode: bf16 probed with its weights prepacked as decoding reads them (`prepacked_linear`); train as always
    key += "|bf16=prepacked" if workload == "decode" else f"|workload={workload}"
    data = read_cache(Path(cache_dir)) if cache_dir is not None else {}
    entry = data.get(key)
    if _valid_entry(entry):
        return resolve_dtype(entry["choice"]), entry["reason"] + " (cached)"
    probe = probe or (probe_forward_costs if workload == "decode" else probe_training_costs)
    choose = choose_dtype if workload == "decode" else choose_training_dtype
    costs = {name: probe(model, resolve_dtype(name), block_size) for name in PROBED}
    choice, reason = choose(costs, block_size, machine=describe_machine(device))
    if choice == "bf16":  # a busy machine can fake a bf16 win once: it must win a second probe too
        again = {name: probe(model, resolve_dtype(name), block_size) for name in PROBED}
        choice, reason = choose({name: _slower(costs[name], again[name]) for name in PROBED}, block_size,
                                machine=describe_machine(device))
    data[key] = {"costs": costs, "choice": choice, "reason": reason,
                 "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if cache_dir is not None:
        write_cache(Path(cache_dir), data)
    return resolve_dtype(choice), reason
