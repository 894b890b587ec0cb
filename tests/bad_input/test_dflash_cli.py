"""`dflash` generate, demo, data, features, train and bench on bad input: the exit status, one line, nothing
changed on disk.

Each row copies good inputs (a tiny target and drafter, prompts, a data set, a training run) into its own
directory, breaks one thing with a `corrupt` helper (or a monkeypatch that breaks the run itself), and runs
the CLI in process. Then: the expected exit status; stderr is exactly one line holding the fragment, with no
traceback and no path printed twice; and every file and folder under the directory is byte-for-byte the same
(sha256 before and after), so no input was touched and no output, empty folder or temporary file was left.

Placeholders in argv: {root} (the row's directory), {target}, {drafter}, {prompts} (JSONL, 8 prompts),
{heldout} (JSONL, 3 prompts; {root} is also a demo models folder), {data} (a `dflash data` set of 2 shards),
{run} (a `dflash train` output with train_state), {new} (a nested output that does not exist yet).
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
from tiny import save_tiny_pair

from bad_input.corrupt import (DROP, add_tensor, binary, drop_tensors, edit_index, edit_json, edit_tensors,
                               invalid_utf8, jsonl, rewrite_shard, set_tensor, snapshot, truncate, write_bytes,
                               write_json, write_text)
from dflash_cli import main


@dataclass(frozen=True)
class Row:
    id: str
    argv: tuple[str, ...]
    code: int
    fragment: str  # must appear in the one line on stderr
    build: Callable[[Path], Any] | None = None  # breaks the copy in the row's directory
    patch: Callable[[Any], None] | None = None  # takes monkeypatch: breaks the run itself


def R(id, argv, code, fragment, build=None, patch=None) -> Row:
    return Row(id, tuple(argv), code, fragment, build, patch)


# ---- argv prefixes ------------------------------------------------------------------------------------

GEN = ("generate", "--target", "{target}", "--drafter", "{drafter}", "--dtype", "fp32", "--max-new-tokens", "4")
GP = (*GEN, "--prompt", "x")
DEMO = ("demo", "--models", "{root}", "--dtype", "fp32", "--max-new-tokens", "4", "--summary-prompts", "0")
DATA = ("data", "--target", "{target}", "--prompts", "{prompts}", "--dtype", "fp32", "--max-new-tokens", "4")
DN = (*DATA, "--out", "{new}")
TRAIN = ("train", "--target", "{target}", "--data", "{data}", "--dtype", "fp32", "--block-size", "4", "--anchors",
         "2", "--batch-size", "2", "--max-steps", "1", "--no-progress")
TN = (*TRAIN, "--out", "{new}")
FEAT = ("features", "--target", "{target}", "--data", "{data}", "--dtype", "fp32", "--shard-size", "4", "--no-progress")
FN = (*FEAT, "--out", "{new}")
BD = ("bench", "drafter", "--hidden", "64", "--context", "8", "--repeats", "1", "--layers", "1", "--out", "{new}")
BE = ("bench", "e2e", "--pair", "a={target}:{drafter}", "--prompts-file", "{heldout}", "--dtypes", "fp32",
      "--max-new-tokens", "4")
BEN = (*BE, "--out", "{new}")
INPUT = "inputs are never modified or deleted"
NUM = "expected a finite number"


def dw(r: Path) -> Path:
    return r / "drafter" / "model.safetensors"


def dc(r: Path) -> Path:
    return r / "drafter" / "config.json"


def tw(r: Path) -> Path:
    return r / "target" / "model.safetensors"


def tc(r: Path) -> Path:
    return r / "target" / "config.json"


def state(r: Path) -> Path:
    return r / "run" / "train_state" / "state.json"


def _pickle_only(folder: Path) -> None:
    (folder / "model.safetensors").unlink()
    write_bytes(folder / "pytorch_model.bin", b"\x80\x04\x95 not loaded")


def _feature_cache(r: Path, edit: Callable[[dict], Any] | None = None) -> Path:
    """A `dflash features` cache of the row's data set in r/features (2 shards of 4 samples), its index edited."""
    args = [a.format(target=r / "target", data=r / "data") for a in FEAT]
    assert main([*args, "--out", str(r / "features"), "--threads", "1"]) == 0
    if edit is not None:
        edit_index(r / "features", edit)
    return r / "features"


def _patch(module: str, name: str, exc: BaseException) -> Callable[[Any], None]:
    def patch(monkeypatch) -> None:
        def fail(*args, **kwargs):
            raise exc

        monkeypatch.setattr(f"{module}.{name}", fail)

    return patch


ROWS = [
    # ---- argparse: one line, never usage + error ---------------------------------------------------------
    R("no-command", [], 2, "the following arguments are required: COMMAND"),
    R("unknown-command", ["fly"], 2, "argument COMMAND: invalid choice: 'fly'"),
    R("gen-missing-drafter", ["generate", "--target", "{target}", "--prompt", "x"], 2,
      "the following arguments are required: --drafter"),
    R("gen-unknown-flag", [*GP, "--bogus"], 2, "unrecognized arguments: --bogus"),
    R("gen-dtype-fp8", [*GP, "--dtype", "fp8"], 2, "argument --dtype: invalid choice: 'fp8'"),
    R("gen-two-prompts", [*GP, "--prompt-file", "{prompts}"], 2, "not allowed with argument"),
    R("bench-no-kind", ["bench"], 2, "the following arguments are required: KIND"),
    R("data-responses-all", [*DN, "--responses", "all"], 2, "argument --responses: invalid choice: 'all'"),
    # ---- numbers: range and finiteness where they enter ------------------------------------------------
    R("gen-temperature-inf", [*GP, "--temperature", "inf"], 2, f"argument --temperature: got 'inf', {NUM} >= 0"),
    R("gen-temperature-nan", [*GP, "--temperature", "nan"], 2, f"argument --temperature: got 'nan', {NUM} >= 0"),
    R("gen-temperature-negative", [*GP, "--temperature", "-1"], 2, "argument --temperature: got '-1'"),
    R("gen-top-p-zero", [*GP, "--top-p", "0"], 2, f"argument --top-p: got '0', {NUM} > 0 and <= 1"),
    R("gen-top-p-above-one", [*GP, "--top-p", "1.5"], 2, "argument --top-p: got '1.5'"),
    R("gen-top-p-nan", [*GP, "--top-p", "nan"], 2, "argument --top-p: got 'nan'"),
    R("gen-top-k-negative", [*GP, "--top-k", "-1"], 2, "argument --top-k: got '-1', expected an integer >= 0"),
    R("gen-seed-65-bits", [*GP, "--temperature", "1", "--seed", str(2**64)], 2,
      f"argument --seed: got '{2**64}', expected an integer in [0, 2^64)"),
    R("gen-seed-negative", [*GP, "--temperature", "1", "--seed", "-1"], 2, "argument --seed: got '-1'"),
    R("gen-max-new-zero", [*GP, "--max-new-tokens", "0"], 2,
      "argument --max-new-tokens: got '0', expected an integer >= 1"),
    R("gen-max-new-text", [*GP, "--max-new-tokens", "abc"], 2, "argument --max-new-tokens: got 'abc'"),
    R("gen-max-new-beyond-positions", [*GP, "--max-new-tokens", "5000"], 2, "beyond the target's 512 positions"),
    R("gen-threads-negative", [*GP, "--threads", "-1"], 2, "argument --threads: got '-1', expected an integer >= 0"),
    R("gen-device-foo", [*GP, "--device", "foo"], 2, "argument --device: device 'foo' is not a torch device"),
    R("gen-device-absent-cuda", [*GP, "--device", "cuda:99"], 2, "argument --device: device 'cuda:99'"),
    R("gen-device-meta", [*GP, "--device", "meta"], 2, "device 'meta' holds no data"),
    R("demo-summary-negative", [*DEMO, "--summary-prompts", "-3"], 2,
      "argument --summary-prompts: got '-3', expected an integer >= 0"),
    R("demo-prompt-index-beyond", [*DEMO, "--prompt-index", "999"], 2, "--prompt-index is 999, expected 0..2"),
    R("demo-prompt-index-negative", [*DEMO, "--prompt-index", "-1"], 2, "argument --prompt-index: got '-1'"),
    R("demo-temperature-inf", [*DEMO, "--temperature", "inf"], 2, "argument --temperature: got 'inf'"),
    R("data-batch-zero", [*DN, "--batch-size", "0"], 2, "argument --batch-size: got '0', expected an integer >= 1"),
    R("data-shard-zero", [*DN, "--shard-size", "0"], 2, "argument --shard-size: got '0'"),
    R("data-sampled-temperature-zero", [*DN, "--responses", "sampled", "--temperature", "0"], 2,
      "temperature is 0 but responses are sampled"),
    R("data-temperature-inf", [*DN, "--responses", "both", "--temperature", "inf"], 2, "argument --temperature"),
    R("data-seed-65-bits", [*DN, "--seed", str(2**64)], 2, "argument --seed"),
    R("train-lr-inf", [*TN, "--lr", "inf"], 2, f"argument --lr: got 'inf', {NUM} > 0"),
    R("train-lr-nan", [*TN, "--lr", "nan"], 2, "argument --lr: got 'nan'"),
    R("train-epochs-inf", [*TN, "--epochs", "inf"], 2, "argument --epochs: got 'inf'"),
    R("train-warmup-one", [*TN, "--warmup-ratio", "1"], 2, f"argument --warmup-ratio: got '1', {NUM} >= 0 and < 1"),
    R("train-gamma-zero", [*TN, "--gamma", "0"], 2, "argument --gamma: got '0'"),
    R("train-weight-decay-negative", [*TN, "--weight-decay", "-1"], 2, "argument --weight-decay: got '-1'"),
    R("train-checkpoint-every-zero", [*TN, "--checkpoint-every", "0"], 2, "argument --checkpoint-every: got '0'"),
    R("train-eval-count-zero", [*TN, "--eval-count", "0"], 2, "argument --eval-count: got '0'"),
    R("train-seed-negative", [*TN, "--seed", "-1"], 2, "argument --seed: got '-1'"),
    R("train-block-one", [*TN, "--block-size", "1"], 2, "argument --block-size: got '1', expected an integer >= 2"),
    R("train-max-length-short", [*TN, "--max-length", "4"], 2, "'max_length' is 4, expected more than block_size"),
    R("train-layer-ids-text", [*TN, "--target-layer-ids", "1,x"], 2, "--target-layer-ids is '1,x', expected comma"),
    R("train-layer-ids-beyond", [*TN, "--target-layer-ids", "1,9"], 2, r"expected ids within [0, 4)"),
    R("bench-blocks-text", [*BD, "--blocks", "a,b"], 2,
      "argument --blocks: got 'a,b', expected a comma-separated list"),
    R("bench-blocks-empty-item", [*BD, "--blocks", "4,,8"], 2, "argument --blocks: got '4,,8'"),
    R("bench-dtypes-fp8", [*BD, "--dtypes", "fp8"], 2, "argument --dtypes: got 'fp8'"),
    R("bench-hidden-odd-heads", [*BD, "--hidden", "576"], 2, "--hidden 576 with --layers 1 gives no valid drafter"),
    R("bench-layers-too-deep", [*BD, "--layers", "7"], 2, "with --layers 7 gives no valid drafter"),
    R("bench-repeats-zero", [*BD, "--repeats", "0"], 2, "argument --repeats: got '0'"),
    R("bench-temperatures-text", [*BEN, "--temperatures", "abc"], 2, "argument --temperatures: got 'abc'"),
    R("bench-temperatures-inf", [*BEN, "--temperatures", "0,inf"], 2, "('inf' is not one)"),
    R("bench-prompts-zero", [*BEN, "--prompts", "0"], 2, "argument --prompts: got '0'"),
    R("bench-name-folder", [*BEN, "--name", "../x"], 2, "argument --name: got '../x'"),
    R("bench-device-foo", [*BEN, "--device", "foo"], 2, "argument --device: device 'foo'"),
    R("bench-pair-malformed", ["bench", "e2e", "--pair", "a=b", "--out", "{new}"], 2, "--pair 'a=b' is malformed"),
    R("bench-pair-missing", ["bench", "e2e", "--pair", "a={root}/nothing:{drafter}", "--out", "{new}"], 2,
      "nothing does not exist"),
    # ---- prompt files and JSONL: UTF-8 text, one line naming the file (and line) ------------------------
    R("gen-prompt-file-latin1", [*GEN, "--prompt-file", "{root}/p.txt"], 2, "p.txt is not UTF-8 text (byte 0xe9",
      build=lambda r: invalid_utf8(r / "p.txt")),
    R("gen-prompt-file-binary", [*GEN, "--prompt-file", "{root}/p.bin"], 2, "p.bin holds binary data (a NUL byte",
      build=lambda r: binary(r / "p.bin")),
    R("gen-prompt-file-empty", [*GEN, "--prompt-file", "{root}/p.txt"], 2, "the prompt is empty",
      build=lambda r: write_text(r / "p.txt", " \n")),
    R("gen-prompt-file-folder", [*GEN, "--prompt-file", "{root}"], 2, "is a directory, expected a text file"),
    R("gen-prompt-file-missing", [*GEN, "--prompt-file", "{root}/none.txt"], 2, "none.txt does not exist"),
    # ---- chat prompts: the tokenizer's chat template, OpenAI-style messages ---------------------------------
    R("gen-chat-no-template", [*GEN, "--chat", "hi"], 2, "the tokenizer has no chat template"),
    R("gen-chat-empty", [*GEN, "--chat", " "], 2, "the --chat message is empty"),
    R("gen-chat-and-prompt", [*GP, "--chat", "hi"], 2, "not allowed with argument"),
    R("data-prompts-bad-messages", DN, 2, "prompts.jsonl:1: message 0 has no 'content' string",
      build=lambda r: write_text(r / "prompts.jsonl", '{"messages": [{"role": "user"}]}\n')),
    R("train-mask-token-unknown", [*TN, "--mask-token", "<nope>"], 2,
      "the mask token '<nope>' is not in the tokenizer"),
    R("data-prompts-latin1", DN, 2, "prompts.jsonl:2 is not UTF-8 text",
      build=lambda r: invalid_utf8(r / "prompts.jsonl")),
    R("data-prompts-binary", DN, 2, "prompts.jsonl:1 holds binary data", build=lambda r: binary(r / "prompts.jsonl")),
    R("data-prompts-list-line", DN, 2, "prompts.jsonl:2 has no non-empty 'prompt' string",
      build=lambda r: jsonl(r / "prompts.jsonl", {"prompt": "a"}, ["a"])),
    R("data-prompts-not-json", DN, 2, "prompts.jsonl:1 is not valid JSON",
      build=lambda r: write_text(r / "prompts.jsonl", "prompt: a\n")),
    R("data-prompts-empty", DN, 2, "prompts.jsonl is empty", build=lambda r: write_text(r / "prompts.jsonl", "\n")),
    R("data-prompts-folder", [*DATA[:3], "--prompts", "{data}", "--out", "{new}"], 2, "is a directory"),
    R("train-eval-prompts-latin1", [*TN, "--eval-prompts", "{root}/e.jsonl"], 2, "e.jsonl:2 is not UTF-8 text",
      build=lambda r: invalid_utf8(r / "e.jsonl")),
    R("train-eval-prompts-binary", [*TN, "--eval-prompts", "{root}/e.jsonl"], 2, "e.jsonl:1 holds binary data",
      build=lambda r: binary(r / "e.jsonl")),
    R("demo-heldout-latin1", DEMO, 2, "heldout.jsonl:2 is not UTF-8 text",
      build=lambda r: invalid_utf8(r / "heldout.jsonl")),
    R("demo-no-models", [*DEMO[:2], "{root}/nothing"], 2, "no target/config.json and no drafter/config.json in"),
    # ---- drafter weights: float dtype for the role, finite, complete --------------------------------------
    R("drafter-nan", GP, 2, "tensor 'norm.weight' holds NaN or infinite values",
      build=lambda r: edit_tensors(dw(r), set_tensor("norm.weight", lambda t: t * float("nan")))),
    R("drafter-inf", GP, 2, "tensor 'fc.weight' holds NaN or infinite values",
      build=lambda r: edit_tensors(dw(r), set_tensor("fc.weight", lambda t: t / 0))),
    R("drafter-int32", GP, 2, "tensor 'norm.weight' has dtype int32, expected float32, bfloat16 or float16",
      build=lambda r: edit_tensors(dw(r), set_tensor("norm.weight", lambda t: t.to(torch.int32)))),
    R("drafter-fp8", GP, 2, "tensor 'fc.weight' has dtype float8_e4m3fn",
      build=lambda r: edit_tensors(dw(r), set_tensor("fc.weight", lambda t: t.to(torch.float8_e4m3fn)))),
    R("drafter-truncated", GP, 2, "drafter/model.safetensors is truncated", build=lambda r: truncate(dw(r))),
    R("drafter-empty-file", GP, 2, "model.safetensors is truncated", build=lambda r: write_bytes(dw(r), b"")),
    R("drafter-corrupt-header", GP, 2, "corrupt safetensors header",
      build=lambda r: write_bytes(dw(r), b"\x10\x00\x00\x00\x00\x00\x00\x00{not json!!!!!!}")),
    R("drafter-missing-tensor", GP, 2, "missing tensor 'layers.0.mlp.down_proj.weight'",
      build=lambda r: edit_tensors(dw(r), drop_tensors("layers.0.mlp.down_proj"))),
    R("drafter-wrong-shape", GP, 2, "tensor 'norm.weight' has shape [7], expected [32]",
      build=lambda r: edit_tensors(dw(r), set_tensor("norm.weight", lambda t: torch.ones(7)))),
    R("drafter-extra-tensor", GP, 2, "unexpected tensor 'lm_head.weight'",
      build=lambda r: edit_tensors(dw(r), add_tensor("lm_head.weight", torch.ones(2, 32)))),
    R("drafter-pickle-only", GP, 2, "holds only pickle weights", build=lambda r: _pickle_only(r / "drafter")),
    R("drafter-missing", [*GEN[:3], "--drafter", "{root}/nothing", "--prompt", "x"], 2, "nothing does not exist"),
    R("drafter-index-not-json", GP, 2, "model.safetensors.index.json is not a valid index",
      build=lambda r: write_text(r / "drafter" / "model.safetensors.index.json", "{bad")),
    R("drafter-onnx-garbage", [*GEN[:3], "--drafter", "{root}/x.onnx", "--drafter-backend", "onnxruntime", "--prompt",
                               "x"], 2, "x.onnx is not a readable ONNX model",
      build=lambda r: write_bytes(r / "x.onnx", b"garbage")),
    # ---- drafter config values ------------------------------------------------------------------------------
    R("drafter-eps-text", GP, 2, "field 'rms_norm_eps' is 'abc', expected a number",
      build=lambda r: edit_json(dc(r), rms_norm_eps="abc")),
    R("drafter-eps-zero", GP, 2, "field 'rms_norm_eps' is 0.0, expected a positive number",
      build=lambda r: edit_json(dc(r), rms_norm_eps=0)),
    R("drafter-rope-linear-no-factor", GP, 2, "field 'rope_scaling' (linear) has factor None",
      build=lambda r: edit_json(dc(r), rope_scaling={"rope_type": "linear"})),
    R("drafter-rope-llama3-partial", GP, 2, "has low_freq_factor None",
      build=lambda r: edit_json(dc(r), rope_scaling={"rope_type": "llama3", "factor": 8.0})),
    R("drafter-rope-text", GP, 2, "field 'rope_scaling' is 'linear', expected an object or null",
      build=lambda r: edit_json(dc(r), rope_scaling="linear")),
    R("drafter-rope-theta-text", GP, 2, "field 'rope_theta' is 'big'",
      build=lambda r: edit_json(dc(r), rope_theta="big")),
    R("drafter-block-2-to-40", GP, 2, f"field 'block_size' is {2**40}, expected at most max_position_embeddings",
      build=lambda r: edit_json(dc(r), block_size=2**40)),
    R("drafter-block-beyond-target", GP, 2, "drafter block_size is 600 but the target takes at most 512 positions",
      build=lambda r: edit_json(dc(r), block_size=600)),
    R("drafter-layer-types-text", GP, 2, "field 'layer_types' is 'full_attention', expected a list",
      build=lambda r: edit_json(dc(r), layer_types="full_attention")),
    R("drafter-layer-types-unknown", GP, 2, "field 'layer_types' is ['dense'], expected 1 entries",
      build=lambda r: edit_json(dc(r), layer_types=["dense"])),
    R("drafter-mask-beyond-vocab", GP, 2, "field 'mask_token_id' is 5000, expected an id within the vocabulary",
      build=lambda r: edit_json(dc(r), dflash_config={"target_layer_ids": [1], "mask_token_id": 5000})),
    R("drafter-config-list", GP, 2, "config.json must hold a JSON object", build=lambda r: write_json(dc(r), [1, 2])),
    R("drafter-config-not-json", GP, 2, "drafter/config.json is not valid JSON",
      build=lambda r: write_text(dc(r), "{bad")),
    R("drafter-config-not-utf8", GP, 2, "drafter/config.json is not valid JSON",
      build=lambda r: write_bytes(dc(r), b"\xff\xfe{}")),
    R("drafter-config-no-hidden", GP, 2, "field 'hidden_size' is missing",
      build=lambda r: edit_json(dc(r), hidden_size=DROP)),
    # ---- target checkpoints: what Hugging Face reports, truncation, values, tokenizer ----------------------
    R("target-missing-layer", GP, 2, "lacks tensor 'model.layers.2.input_layernorm.weight' (11 missing in all)",
      build=lambda r: edit_tensors(tw(r), drop_tensors("model.layers.2."))),
    R("target-unexpected-tensor", GP, 2, "holds unexpected tensor 'model.bogus.weight'",
      build=lambda r: edit_tensors(tw(r), add_tensor("model.bogus.weight", torch.ones(3)))),
    R("target-shape-mismatch", GP, 2, "tensor 'model.norm.weight' has shape [7], expected [32] from its config.json",
      build=lambda r: edit_tensors(tw(r), set_tensor("model.norm.weight", lambda t: torch.ones(7)))),
    R("target-truncated", GP, 2, "target/model.safetensors is truncated", build=lambda r: truncate(tw(r))),
    R("target-nan", GP, 2, "tensor 'model.norm.weight' holds NaN or infinite values",
      build=lambda r: edit_tensors(tw(r), set_tensor("model.norm.weight", lambda t: t * float("nan")))),
    R("target-int32", GP, 2, "tensor 'model.norm.weight' is stored as I32, expected F32, BF16 or F16",
      build=lambda r: edit_tensors(tw(r), set_tensor("model.norm.weight", lambda t: t.to(torch.int32)))),
    R("target-no-tokenizer", GP, 2, "has no tokenizer (none of tokenizer.json",
      build=lambda r: [(r / "target" / f).unlink() for f in ("tokenizer.json", "tokenizer_config.json")]),
    R("target-tokenizer-not-json", GP, 2, "tokenizer.json is not valid JSON",
      build=lambda r: write_text(r / "target" / "tokenizer.json", "{bad")),
    R("target-config-list", GP, 2, "target/config.json holds a JSON array, expected an object",
      build=lambda r: write_json(tc(r), [1, 2])),
    R("target-config-not-json", GP, 2, "target/config.json is not valid JSON (Expecting property name",
      build=lambda r: write_text(tc(r), "{bad")),
    R("target-config-no-model-type", GP, 2, "has no 'model_type' string",
      build=lambda r: edit_json(tc(r), model_type=DROP)),
    R("target-no-weights", GP, 2, "has no model.safetensors and no model.safetensors.index.json",
      build=lambda r: tw(r).unlink()),
    R("target-pickle-only", GP, 2, "only pickle .bin/.pt files, never loaded",
      build=lambda r: _pickle_only(r / "target")),
    R("target-missing", ["generate", "--target", "{root}/nothing", "--drafter", "{drafter}", "--prompt", "x"], 2,
      "nothing is not a Hugging Face model directory (no config.json)"),
    R("data-target-missing-layer", DN, 2, "lacks tensor 'model.layers.2.",
      build=lambda r: edit_tensors(tw(r), drop_tensors("model.layers.2."))),
    R("train-target-missing-layer", TN, 2, "lacks tensor 'model.layers.2.",
      build=lambda r: edit_tensors(tw(r), drop_tensors("model.layers.2."))),
    R("train-target-no-tokenizer", TN, 2, "has no tokenizer",
      build=lambda r: [(r / "target" / f).unlink() for f in ("tokenizer.json", "tokenizer_config.json")]),
    # ---- data sets (`dflash train --data`) ----------------------------------------------------------------
    R("data-shard-no-sha256", TN, 2, "index.json: shard entry 0 has no 'sha256'",
      build=lambda r: edit_index(r / "data", lambda i: i["shards"][0].pop("sha256"))),
    R("data-shards-string", TN, 2, "index.json: field 'shards' is a JSON string, expected a list",
      build=lambda r: edit_index(r / "data", lambda i: i.__setitem__("shards", "shard-00000.safetensors"))),
    R("data-shard-outside", TN, 2, "shard entry 1 has file '../x.safetensors'",
      build=lambda r: edit_index(r / "data", lambda i: i["shards"][1].__setitem__("file", "../x.safetensors"))),
    R("data-tokens-beyond-vocab", TN, 2, "holds token id 999, beyond the target's vocabulary [0, 300)",
      build=lambda r: rewrite_shard(r / "data", 1, lambda t: np.where(np.arange(len(t)) == 3, 999, t))),
    R("data-tokens-negative", TN, 2, "shard-00000.safetensors is corrupt (negative token id -5)",
      build=lambda r: rewrite_shard(r / "data", 0, lambda t: np.where(np.arange(len(t)) == 0, -5, t))),
    R("data-index-not-json", TN, 2, "data/index.json is not valid JSON",
      build=lambda r: write_text(r / "data" / "index.json", "{")),
    R("data-index-list", TN, 2, "data/index.json holds a JSON array",
      build=lambda r: write_json(r / "data" / "index.json", [])),
    R("data-shard-missing", TN, 2, "shard-00001.safetensors is missing (listed in index.json)",
      build=lambda r: (r / "data" / "shard-00001.safetensors").unlink()),
    R("data-shard-changed", TN, 2, "shard-00001.safetensors is corrupt (its sha256 differs",
      build=lambda r: truncate(r / "data" / "shard-00001.safetensors", 4)),
    R("data-no-shards", TN, 2, "holds no samples",
      build=lambda r: edit_index(r / "data", lambda i: i.__setitem__("shards", []))),
    R("data-not-a-data-set", [*TRAIN[:3], "--data", "{drafter}", "--out", "{new}"], 2, "is not a data set"),
    # ---- feature caches (`dflash features`, `dflash train --features`) ------------------------------------
    R("features-layer-beyond", [*FN, "--target-layer-ids", "1,9"], 2, "reach layer 9, but the target has 4 layers"),
    R("features-spacing-too-many", [*FN, "--feature-layers", "3"], 2, "holds only 1 distinct layers"),
    R("features-not-a-data-set", [*FEAT[:3], "--data", "{drafter}", "--out", "{new}"], 2, "is not a data set"),
    R("features-out-is-data", [*FEAT, "--out", "{data}", "--force"], 2, f"data is the input: {INPUT}"),
    R("features-out-other-settings", [*FEAT, "--out", "{root}/features", "--shard-size", "3"], 2,
      "already holds features made with other settings (shard_size differ)", build=lambda r: _feature_cache(r)),
    R("train-features-not-a-cache", [*TN, "--features", "{drafter}"], 2, "is not a feature cache"),
    R("train-features-incomplete", [*TN, "--features", "{root}/features"], 2, "is incomplete (4 of 8 samples)",
      build=lambda r: _feature_cache(r, lambda i: i["shards"].pop())),
    R("train-features-shard-changed", [*TN, "--features", "{root}/features"], 2,
      "features-00001.safetensors is corrupt (its sha256 differs",
      build=lambda r: truncate(_feature_cache(r) / "features-00001.safetensors", 4)),
    # ---- --out: inputs are sacred, outputs whole or absent, other data kept ------------------------------
    R("data-out-is-file", [*DATA, "--out", "{heldout}"], 2, "heldout.jsonl is an existing file"),
    R("data-out-is-target", [*DATA, "--out", "{target}", "--force"], 2, f"target is the input: {INPUT}"),
    R("data-out-inside-target", [*DATA, "--out", "{target}/data"], 2, "lies inside the input"),
    R("data-out-contains-prompts", [*DATA, "--out", "{root}", "--force"], 2, "contains the input"),
    R("data-out-holds-other-files", [*DATA, "--out", "{drafter}"], 2, "already holds other files; pass --force"),
    R("data-out-under-file", [*DATA, "--out", "{heldout}/sub/out"], 2, "which is a file, not a directory"),
    R("data-out-corrupt-index", [*DATA, "--out", "{data}"], 2, "data/index.json is not valid JSON",
      build=lambda r: write_text(r / "data" / "index.json", '{"settings": ')),
    R("data-out-index-no-settings", [*DATA, "--out", "{data}"], 2, "has no 'settings' object",
      build=lambda r: edit_index(r / "data", lambda i: i.pop("settings"))),
    R("data-out-other-settings", [*DATA, "--out", "{data}"], 2, "already holds data made with different settings"),
    R("train-out-published-drafter", [*TRAIN, "--out", "{drafter}"], 2, "--out {drafter} already holds other files"),
    R("train-out-is-data", [*TRAIN, "--out", "{data}", "--force"], 2, f"data is the input: {INPUT}"),
    R("train-out-inside-target", [*TRAIN, "--out", "{target}/d"], 2, "lies inside the input"),
    R("train-out-is-file", [*TRAIN, "--out", "{heldout}"], 2, "is an existing file"),
    R("train-out-under-file", [*TRAIN, "--out", "{heldout}/d"], 2, "which is a file, not a directory"),
    R("train-out-holds-other-files", [*TRAIN, "--out", "{root}/notes"], 2, "already holds other files",
      build=lambda r: write_text(r / "notes" / "todo.txt", "mine")),
    R("train-resume-state-empty", [*TRAIN, "--out", "{run}"], 2, "state.json has no 'meta' and 'optimizer' objects",
      build=lambda r: write_json(state(r), {})),
    R("train-resume-state-not-json", [*TRAIN, "--out", "{run}"], 2, "state.json is not valid JSON",
      build=lambda r: write_text(state(r), '{"meta": ')),
    R("train-resume-state-no-train", [*TRAIN, "--out", "{run}"], 2, "lacks meta.step, meta.train or meta.history",
      build=lambda r: edit_json(state(r), meta={})),
    R("train-resume-optimizer-truncated", [*TRAIN, "--out", "{run}"], 2, "train_state is unreadable",
      build=lambda r: truncate(r / "run" / "train_state" / "optimizer.safetensors")),
    R("train-resume-other-settings", [*TRAIN, "--out", "{run}", "--lr", "0.1"], 2,
      "the saved run differs in learning_rate"),
    R("bench-out-is-file", [*BE, "--out", "{prompts}"], 2, "prompts.jsonl is an existing file"),
    R("bench-out-is-target", [*BE, "--out", "{target}", "--force"], 2, "is the input"),
    R("bench-out-holds-a-model", [*BD[:-1], "{drafter}"], 2, "already holds other files; pass --force"),
    # ---- bugs and Ctrl-C: one line, nothing half-written ------------------------------------------------------
    R("gen-internal-error", GP, 1, "dflash generate: internal error: RuntimeError: boom (re-run with --debug for the "
      "traceback)", patch=_patch("dflash_cli.generate", "load_pair", RuntimeError("boom"))),
    R("data-ctrl-c", DN, 130, "dflash data: interrupted",
      patch=_patch("dflash_core.training.data", "_generate", KeyboardInterrupt())),
    R("train-ctrl-c", TN, 130, "dflash train: interrupted",
      patch=_patch("dflash_core.training.trainer.Trainer", "train_step", KeyboardInterrupt())),
    R("features-ctrl-c", FN, 130, "dflash features: interrupted",
      patch=_patch("dflash_core.training.features", "features_of", KeyboardInterrupt())),
]


# ---- the runner ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    """Good inputs, copied by every row: a tiny pair, prompts, a data set and a one-step training run."""
    root = tmp_path_factory.mktemp("good")
    save_tiny_pair(root)
    jsonl(root / "prompts.jsonl", *({"prompt": f"def f{i}(x):\n    return"} for i in range(8)))
    jsonl(root / "heldout.jsonl", {"prompt": "def main("}, {"prompt": "import os\n"}, {"prompt": "x = ["})
    fast = ["--dtype", "fp32", "--threads", "1"]
    assert main(["data", "--target", str(root / "target"), "--prompts", str(root / "prompts.jsonl"), "--out",
                 str(root / "data"), "--max-new-tokens", "8", "--batch-size", "4", "--shard-size", "4", *fast]) == 0
    assert main(["train", "--target", str(root / "target"), "--data", str(root / "data"), "--out", str(root / "run"),
                 "--block-size", "4", "--anchors", "2", "--batch-size", "2", "--max-steps", "1", "--no-progress",
                 *fast]) == 0
    return root


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = main(argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_input(row: Row, good: Path, tmp_path: Path, capsys, monkeypatch):
    root = tmp_path / "case"
    shutil.copytree(good, root)
    places = {name: str(root / name) for name in ("target", "drafter", "data", "run")}
    places |= {"root": str(root), "prompts": str(root / "prompts.jsonl"), "heldout": str(root / "heldout.jsonl"),
               "new": str(root / "new" / "out")}
    if row.build:
        row.build(root)
    if row.patch:
        row.patch(monkeypatch)
    monkeypatch.chdir(root)  # `dflash bench` reads sys.argv; nothing may land in the working directory either
    before = snapshot(root)
    code, err = run_cli([a.format(**places) for a in row.argv] + ["--threads", "1"] * _takes_threads(row.argv),
                        capsys)
    lines = err.strip().splitlines()
    assert code == row.code, err
    assert len(lines) == 1, err
    assert row.fragment.format(**places) in lines[0], lines[0]
    assert "Traceback" not in err
    named = re.findall(re.escape(str(root)) + r"[^\s:,;()'\"]*", lines[0])
    assert len(named) == len(set(p.rstrip(".") for p in named)), f"a path printed twice: {lines[0]}"
    assert snapshot(root) == before, "bad input changed something on disk"


def _takes_threads(argv: tuple[str, ...]) -> int:
    """Rows of commands with --threads run on one thread (tiny models), unless the row sets it itself."""
    return int(bool(argv) and argv[0] in ("generate", "demo", "data", "features", "train", "bench")
               and "--threads" not in argv and not (argv[0] == "bench" and len(argv) == 1))


def test_debug_shows_the_traceback(good: Path, tmp_path: Path, monkeypatch):
    """A bug is one line by default; `--debug`, anywhere on the line, re-raises it for the traceback."""
    _patch("dflash_cli.generate", "load_pair", RuntimeError("boom"))(monkeypatch)
    argv = [a.format(target=good / "target", drafter=good / "drafter") for a in GP]
    with pytest.raises(RuntimeError, match="boom"):
        main(["--debug", *argv])
    with pytest.raises(RuntimeError, match="boom"):
        main([*argv, "--debug"])


def test_help_exits_0(capsys):
    assert main(["generate", "--help"]) == 0
    assert "--temperature" in capsys.readouterr().out


def test_a_published_drafter_is_kept_and_replaced_only_with_force(good: Path, tmp_path: Path, capsys):
    """The data-destroyed bug: `dflash train --out` a published drafter replaced it silently; now --force is needed."""
    out = tmp_path / "published"
    shutil.copytree(good / "drafter", out)
    argv = [a.format(target=good / "target", data=good / "data", new=out) for a in TN] + ["--threads", "1"]
    before = snapshot(out)
    assert main(argv) == 2 and snapshot(out) == before
    assert main([*argv, "--force"]) == 0, capsys.readouterr().err
    assert (out / "train_state").is_dir() and snapshot(out) != before
    assert main(argv) == 0  # now it is this command's own state: resumed without --force
