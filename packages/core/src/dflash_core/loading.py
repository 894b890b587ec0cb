"""Loading a target and its drafter from directories, ready for `generate` (the library's front door).

Only safetensors and JSON are read: no pickle, no `trust_remote_code`. Every failure is a
one-line `DFlashError` naming the directory and what was expected.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dflash_core.tuning.auto_dtype import resolve_auto_dtype
from dflash_core.tuning.plan import Tuning
from dflash_core.model.config import DFlashConfig
from dflash_core.model.drafter import WEIGHT_FORMATS, load_drafter
from dflash_core.model.ort_drafter import load_onnx_drafter
from dflash_core.model.backend import DrafterBackend
from dflash_core.dtypes import resolve_dtype, short_name
from dflash_core.errors import CompatibilityError
from dflash_core.devices import check_device
from dflash_core.kernels import packed_weights
from dflash_core.kernels.packed_weights import packed_matmuls
from dflash_core.target.pairing import check_compatibility, ensure_mask_token
from dflash_core.kernels.prepacked_linear import prepack_linears
from dflash_core.target.prompts import encode_prompt, end_of_turn_ids  # noqa: F401 (encode_prompt: the front door's)
from dflash_core.target.adapter import TargetModel
from dflash_core.target.checks import (check_loading_info, check_target_weights, check_tokenizer_files, first_line,
                            read_target_config, read_target_headers)


def load_target(path: str | os.PathLike, layer_ids=(), dtype: str | torch.dtype = "bf16",
                device: str | torch.device = "cpu") -> TargetModel:
    """A Hugging Face causal LM directory (safetensors, no remote code) as a TargetModel.

    Refused with one line: a malformed config, truncated weight files, tensors Hugging Face reports as
    missing, unexpected or mismatched, integer or fp8 weights in an unquantised target, NaN or inf.
    """
    path = Path(path)
    device = check_device(device)
    config = read_target_config(path)
    headers = read_target_headers(path)
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its load report would be a second, partial message; we refuse instead
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=resolve_dtype(dtype), trust_remote_code=False, use_safetensors=True,
            output_loading_info=True, ignore_mismatched_sizes=True)
    except Exception as exc:  # transformers and safetensors raise many types; one line naming the directory
        raise CompatibilityError(f"cannot load target{first_line(exc, path)}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    check_loading_info(path, info)
    check_target_weights(path, model, headers, quantized="quantization_config" in config)
    return TargetModel(model.to(device).eval(), layer_ids)


def load_target_auto(path: str | os.PathLike, layer_ids=(), block_size: int = 16, device: str | torch.device = "cpu",
                     *, workload: str = "decode", tuning: Tuning | None = None) -> tuple[TargetModel, torch.dtype, str]:
    """`load_target` in the precision `dtype='auto'` picks: (target, its dtype, one line naming the choice and why).

    The target is loaded in fp32, probed (`dflash_core.tuning.auto_dtype`; cached per machine and model in
    `tuning`'s cache directory where it has one) and cast
    to bf16 only where bf16 is measured faster here for `workload`: "decode" (forwards over 1 and
    `block_size` new tokens) or "train" (a training-sized forward; `dflash train`, the demo build's data and
    training): on a CPU without bf16 hardware both are several times faster in fp32, and on one with AMX a
    training batch can gain from bf16 where one decode token does not.
    """
    target = load_target(path, layer_ids, "fp32", device)
    chosen, reason = resolve_auto_dtype(target.model, block_size, device=torch.device(device), workload=workload,
                                        cache_dir=tuning.cache_dir if tuning is not None else None)
    target.model.to(chosen)
    return target, chosen, reason


def load_tokenizer(path: str | os.PathLike):
    from transformers import AutoTokenizer

    path = Path(path)
    check_tokenizer_files(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except Exception as exc:  # tokenizers raises its own types; one line naming the directory
        raise CompatibilityError(f"cannot load the tokenizer{first_line(exc, path)}") from None
    if len(tokenizer) == 0:
        raise CompatibilityError(f"the tokenizer of {path} has an empty vocabulary, expected the target's tokenizer.")
    return tokenizer


@dataclass
class Pair:
    """A target and its drafter in one precision on one device, checked against each other."""

    target: TargetModel
    drafter: DrafterBackend
    tokenizer: object
    notes: list[str] = field(default_factory=list)
    """One-line remarks for the user (a mask token added, the dtype chosen and why)."""
    tuning: Tuning = field(default_factory=Tuning)
    """This machine's measurements for the pair: pass it to `generate(..., tuning=pair.tuning)`."""

    def __iter__(self):  # target, drafter, tokenizer = load_pair(...)
        return iter((self.target, self.drafter, self.tokenizer))


def load_pair(target_dir: str | os.PathLike, drafter_dir: str | os.PathLike, *, dtype: str | torch.dtype = "auto",
              device: str | torch.device | None = None, backend: str = "torch", threads: int = 0,
              drafter_weights: str = "auto", tuning: Tuning | None = None) -> Pair:
    """Drafter and target loaded in one precision, checked against each other before anything runs.

    dtype "auto" (default): bf16 only where a short measured probe says it is faster for this target
    on this machine (`dflash_core.tuning.auto_dtype`; cached per machine and model where `tuning` has a cache
    directory), else fp32; the choice and its reason are the first of `notes`. `tuning` (default: a new
    in-memory `Tuning`, which writes nothing) is returned as `Pair.tuning` for `generate` to reuse. backend "onnxruntime" runs an exported drafter graph (a
    .onnx file or a `dflash-convert --to onnx` directory) with ONNX Runtime on the CPU; the target
    stays in torch. drafter_weights (torch backend): how decoding's drafter matmuls read their weights,
    "plain", "fp16-packed", "bf16", "bf16-prepacked" (`dflash_core.kernels.packed_weights`), or "auto" (default): for an
    fp32 drafter on a CPU, bf16 copies where the CPU has bf16 in hardware (AMX-BF16, AVX512-BF16), else
    fp16-packed ones where FBGEMM runs, each matmul then measuring at which row counts its copy beats fp32;
    for a bf16 one, its weights prepacked for oneDNN where that measured faster (plain where none did). The target computes the same numbers it would alone; in bf16 on a CPU its linear layers read weights
    reordered for oneDNN once instead of at every call (`dflash_core.kernels.prepacked_linear`: the same bits, faster).
    """
    if drafter_weights not in ("auto",) + WEIGHT_FORMATS:
        raise ValueError(f"drafter_weights {drafter_weights!r} is not one of auto, {', '.join(WEIGHT_FORMATS)}")
    device = torch.device(device or "cpu")
    tuning = Tuning() if tuning is None else tuning
    notes: list[str] = []
    if backend == "onnxruntime":
        drafter = load_onnx_drafter(drafter_dir, threads=threads)
        if dtype == "auto":  # the graph's precision decides: the target must feed it the same
            dtype = drafter.dtype
            notes.append(f"dtype {short_name(dtype)}: the precision of the ONNX drafter graph")
        target = load_target(target_dir, drafter.config.target_layer_ids, dtype, device)
    else:
        if dtype == "auto":
            config = DFlashConfig.from_pretrained(drafter_dir)
            target, dtype, reason = load_target_auto(target_dir, config.target_layer_ids, config.block_size, device,
                                                     tuning=tuning)
            notes.append(f"dtype {reason}")
        else:
            target = None
        drafter = load_drafter(drafter_dir, device=device, dtype=dtype)
        target = target or load_target(target_dir, drafter.config.target_layer_ids, dtype, device)
        weights_note = _choose_drafter_weights(drafter, drafter_weights)
        notes += [weights_note] if weights_note else []
    check_compatibility(drafter.config, target)
    drafter.check_runtime(target)
    packed = prepack_linears(target.model)
    if packed:
        notes.append(f"target: {packed} bf16 linear layers read weights prepacked for oneDNN (the same bits, "
                     "measured faster here)")
    tokenizer = load_tokenizer(target_dir)
    note = ensure_mask_token(tokenizer, drafter.config)
    return Pair(target, drafter, tokenizer, notes + ([note] if note else []), tuning)


def _choose_drafter_weights(drafter, requested: str) -> str | None:
    """Apply `requested` to a torch drafter; a one-line note when copies were tried (what was kept). "auto" tries
    bf16 copies where the CPU has bf16 in hardware, then fp16-packed ones where FBGEMM runs, and keeps the first
    kind that beat fp32 at some row count."""
    if requested == "plain":
        return None
    candidates = [requested] if requested != "auto" else [
        f for f in ("bf16", "fp16-packed", "bf16-prepacked")
        if packed_weights.format_supported(f, drafter.device, drafter.dtype)]
    for weight_format in candidates:
        drafter.use_weight_format(weight_format)  # explicit and unsupported: a CompatibilityError naming why
        with torch.inference_mode():  # copies now (decoding's weights), each matmul measuring where it pays
            matmuls = packed_matmuls(drafter.decode_weights())
        won = [w.faster_rows for w in matmuls if w.faster_rows]
        if won or requested != "auto":
            kernel = {"fp16-packed": "fp16-packed (FBGEMM, fp32 arithmetic)",
                      "bf16": "bf16 copies (native bf16 matmuls, fp32 in and out)",
                      "bf16-prepacked": "bf16 prepacked for oneDNN (the same bits)"}[weight_format]
            span = f"{min(min(r) for r in won)}-{max(max(r) for r in won)}" if won else "no"
            baseline = "plain bf16" if weight_format == "bf16-prepacked" else "fp32"
            return (f"drafter weights {kernel} for {len(won)} of {len(matmuls)} matmuls, at {span} rows: measured "
                    f"faster than {baseline} there on this CPU")
    if not candidates:
        return None
    drafter.use_weight_format("plain")
    return f"drafter weights plain: {' and '.join(candidates)} matmuls were not faster than fp32 on this CPU"


def stop_token_ids(target: TargetModel, tokenizer) -> list[int]:
    """The target's end-of-sequence ids (generation config, then tokenizer), then its chat template's end of turn."""
    ids = getattr(getattr(target.model, "generation_config", None), "eos_token_id", None)
    if ids is None:
        ids = tokenizer.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    return ids + [i for i in end_of_turn_ids(tokenizer) if i not in ids]
