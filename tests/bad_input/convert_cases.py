"""Bad inputs for dflash-convert, one row each: a good tiny pair is copied, then one thing is broken.

A row's argv may name `{drafter}`, `{target}`, `{state}` (a `dflash train` state directory made by
`train_state`), `{root}` (the case directory) and `{out}` (a new, nested output: `{root}/new/out`).
A builder takes the case directory and breaks the copy in place with the corrupt-file helpers below.
A patch takes pytest's monkeypatch, to break the run itself (Ctrl-C, a bug) at a chosen point.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from bad_input.corrupt import DROP, edit_json, edit_tensors, set_tensor, truncate, write_bytes, write_text

OUT = ("--out", "{out}")


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    code: int
    fragment: str  # must appear in the one line on stderr
    build: Callable[[Path], Any] | None = None
    patch: Callable[[Any], None] | None = None
    pending: str | None = None  # why the row cannot pass yet (an expected failure until then)


# ---- corrupt-file helpers: each edits one file in place ------------------------------------------


def train_state(root: Path, state: Any | None = None, text: str | None = None) -> Path:
    """`{root}/run/train_state`: the drafter's weights and a state.json (`state` as JSON, or raw `text`)."""
    directory = root / "run" / "train_state"
    directory.mkdir(parents=True)
    (directory / "model.safetensors").write_bytes((root / "drafter" / "model.safetensors").read_bytes())
    if state is None and text is None:
        state = {"meta": {"step": 1, "drafter": json.loads((root / "drafter" / "config.json").read_text())},
                 "optimizer": {}}
    (directory / "state.json").write_text(text if text is not None else json.dumps(state))
    return directory


def drafter_config_state(root: Path, **changes: Any) -> None:
    """A train state whose meta.drafter has `changes`."""
    config = json.loads((root / "drafter" / "config.json").read_text())
    config.update(changes)
    train_state(root, {"meta": {"drafter": config}})


# ---- patches: break the run itself ---------------------------------------------------------------


def _in_build(exc: BaseException) -> Callable[[Any], None]:
    """Make `--to sglang`'s build write a file into the staging directory, then raise `exc`."""

    def patch(monkeypatch) -> None:
        from dflash_convert.targets import sglang

        def build(job, tmp):
            (tmp / "model.safetensors").write_bytes(b"half")
            raise exc

        monkeypatch.setattr(sglang, "build", build)

    return patch


def _in_read(exc: BaseException) -> Callable[[Any], None]:
    """Raise `exc` while SRC is being read (before anything is staged)."""

    def patch(monkeypatch) -> None:
        from dflash_convert import command

        def read_source(path):
            raise exc

        monkeypatch.setattr(command, "read_source", read_source)

    return patch


def _in_swap(monkeypatch) -> None:
    """Ctrl-C right after the old output was moved aside, before the new one is renamed into place."""
    import dflash_core.files.atomic as fileio

    real = os.replace

    def replace(src, dst):
        if Path(src).is_dir() and Path(src).name.endswith(".tmp"):  # the staged output going into place
            raise KeyboardInterrupt
        return real(src, dst)

    monkeypatch.setattr(fileio.os, "replace", replace)


def _existing_output(root: Path) -> None:
    write_text(root / "old" / "keep.txt", "mine")


def _symlink_to_drafter(root: Path) -> None:
    (root / "link").symlink_to(root / "drafter", target_is_directory=True)


def _weights(root: Path) -> Path:
    return root / "drafter" / "model.safetensors"


def _target_config(root: Path) -> Path:
    return root / "target" / "config.json"


def _target_weights(root: Path) -> Path:
    return root / "target" / "model.safetensors"


def _index(root: Path, text: str) -> None:
    weights = _weights(root)
    weights.rename(root / "drafter" / "model-00001-of-00001.safetensors")
    write_text(root / "drafter" / "model.safetensors.index.json", text)


SG = ("{drafter}", "--to", "sglang")
TM = ("--target-model", "{target}")
LM = ("{drafter}", "--to", "onnx", "--with-lm-head", "--target-model", "{target}", *OUT)
EXPECT_INPUT = "inputs are never modified or deleted"

CASES = [
    # ---- inputs are sacred: --out is, holds or lies inside an input, --force or not ----------------
    Case("out-is-src-force", ("{drafter}", "--to", "onnx", "--out", "{drafter}", "--force"), 2, EXPECT_INPUT),
    Case("out-inside-src", (*SG, "--out", "{drafter}/sub"), 2, "lies inside the input"),
    Case("out-contains-src-force", (*SG, "--out", "{root}", "--force"), 2, "contains the input"),
    Case("out-is-target-force", (*SG, *TM, "--out", "{target}", "--force"), 2, "is the input"),
    Case("out-inside-target", (*SG, *TM, "--out", "{target}/draft"), 2, "lies inside the input"),
    Case("out-beside-weights-file", ("{drafter}/model.safetensors", "--to", "sglang", "--out", "{drafter}/x"), 2,
         "lies inside the input"),
    Case("out-symlink-to-src-force", (*SG, "--out", "{root}/link", "--force"), 2, "is the input",
         build=_symlink_to_drafter),
    Case("out-is-train-state-force", ("{state}", "--to", "trtllm", "--out", "{state}", "--force"), 2,
         "is the input", build=train_state),
    # ---- outputs: whole or nothing; never onto a file; never unrelated data without --force ------
    Case("out-is-file-force", (*SG, "--out", "{root}/file", "--force"), 2, "is an existing file",
         build=lambda r: write_text(r / "file", "data")),
    Case("out-under-file", (*SG, "--out", "{root}/file/sub"), 2, "which is a file",
         build=lambda r: write_text(r / "file", "data")),
    Case("out-holds-files", (*SG, "--out", "{root}/old"), 2, "pass --force", build=_existing_output),
    Case("ctrl-c-new-nested-out", (*SG, *OUT), 130, "interrupted", patch=_in_build(KeyboardInterrupt())),
    Case("ctrl-c-force-existing", (*SG, "--out", "{root}/old", "--force"), 130, "interrupted",
         build=_existing_output, patch=_in_build(KeyboardInterrupt())),
    Case("ctrl-c-during-swap", (*SG, "--out", "{root}/old", "--force"), 130, "interrupted",
         build=_existing_output, patch=_in_swap),
    Case("ctrl-c-reading-source", (*SG, *OUT), 130, "interrupted", patch=_in_read(KeyboardInterrupt())),
    Case("dry-run-out-is-src", (*SG, "--out", "{drafter}", "--dry-run"), 2, EXPECT_INPUT),
    Case("bug-in-build", (*SG, *OUT), 1, "internal error: RuntimeError: boom (re-run with --debug",
         patch=_in_build(RuntimeError("boom"))),
    Case("fails-in-build-nested-out", LM, 2, "has no tensor lm_head.weight",
         build=lambda r: edit_tensors(_target_weights(r), lambda t: t.pop("lm_head.weight"))),
    # ---- argparse: one line -----------------------------------------------------------------------
    Case("arg-bad-target", ("{drafter}", "--to", "foo", *OUT), 2, "argument --to: invalid choice: 'foo'"),
    Case("arg-missing-to", ("{drafter}", *OUT), 2, "the following arguments are required: --to"),
    Case("arg-missing-out", SG, 2, "the following arguments are required: --out"),
    Case("arg-bad-dtype", (*SG, *OUT, "--dtype", "fp8"), 2, "argument --dtype: invalid choice: 'fp8'"),
    Case("arg-unknown", (*SG, *OUT, "--bogus"), 2, "unrecognized arguments: --bogus"),
    Case("arg-none", (), 2, "the following arguments are required"),
    Case("arg-empty-out", (*SG, "--out", "", "--force"), 2, "argument --out: expected a path, got an empty string"),
    Case("arg-empty-src", ("", "--to", "sglang", *OUT), 2, "argument SRC: expected a path, got an empty string"),
    Case("arg-empty-target", (*SG, "--target-model", "", *OUT), 2, "argument --target-model: expected a path"),
    # ---- SRC: missing, not a drafter, corrupt config ---------------------------------------------
    Case("src-missing", ("{root}/nothing", "--to", "sglang", *OUT), 2, "does not exist"),
    Case("src-empty-dir", ("{root}/empty", "--to", "sglang", *OUT), 2, "config.json does not exist",
         build=lambda r: (r / "empty").mkdir()),
    Case("src-text-file", ("{root}/notes.txt", "--to", "sglang", *OUT), 2, "notes.txt is not valid JSON",
         build=lambda r: write_text(r / "notes.txt", "hello")),
    Case("config-list", (*SG, *OUT), 2, "must hold a JSON object",
         build=lambda r: write_text(r / "drafter" / "config.json", "[1, 2]")),
    Case("config-not-json", (*SG, *OUT), 2, "config.json is not valid JSON",
         build=lambda r: write_text(r / "drafter" / "config.json", "{bad")),
    Case("config-not-utf8", (*SG, *OUT), 2, "config.json is not valid JSON",
         build=lambda r: write_bytes(r / "drafter" / "config.json", b"\xff\xfe{}")),
    Case("config-missing-field", (*SG, *OUT), 2, "hidden_size",
         build=lambda r: edit_json(r / "drafter" / "config.json", hidden_size=DROP)),
    Case("config-eps-string", (*SG, *OUT), 2, "rms_norm_eps",
         build=lambda r: edit_json(r / "drafter" / "config.json", rms_norm_eps="abc")),
    Case("config-block-huge", (*SG, *OUT), 2, "block_size",
         build=lambda r: edit_json(r / "drafter" / "config.json", block_size=2 ** 40)),
    Case("config-linear-rope-no-factor", (*SG, *OUT), 2, "factor",
         build=lambda r: edit_json(r / "drafter" / "config.json", rope_scaling={"rope_type": "linear"})),
    # ---- SRC weights: truncated, corrupt, wrong names/shapes, unusable values ----------------------
    Case("weights-truncated", (*SG, *OUT), 2, "model.safetensors is truncated",
         build=lambda r: truncate(_weights(r), 100)),
    Case("weights-empty-file", (*SG, *OUT), 2, "model.safetensors is truncated",
         build=lambda r: write_bytes(_weights(r), b"")),
    Case("weights-corrupt-header", (*SG, *OUT), 2, "corrupt safetensors header",
         build=lambda r: write_bytes(_weights(r), b"\x10\x00\x00\x00\x00\x00\x00\x00{not json!!!!!!}")),
    Case("weights-missing-tensor", (*SG, *OUT), 2, "missing tensor 'layers.1.mlp.down_proj.weight'",
         build=lambda r: edit_tensors(_weights(r), lambda t: t.pop("layers.1.mlp.down_proj.weight"))),
    Case("weights-wrong-shape", (*SG, *OUT), 2, "tensor 'norm.weight' has shape [7], expected [32]",
         build=lambda r: edit_tensors(_weights(r), set_tensor("norm.weight", lambda t: torch.ones(7)))),
    Case("weights-extra-tensor", (*SG, *OUT), 2, "unexpected tensor 'lm_head.weight'",
         build=lambda r: edit_tensors(_weights(r), lambda t: t.__setitem__("lm_head.weight", torch.ones(2, 32)))),
    Case("weights-nan", (*SG, *OUT), 2, "tensor 'norm.weight' holds NaN or infinite values",
         build=lambda r: edit_tensors(_weights(r), set_tensor("norm.weight", lambda t: t * float("nan")))),
    Case("weights-inf", (*SG, *OUT), 2, "holds NaN or infinite values",
         build=lambda r: edit_tensors(_weights(r), set_tensor("fc.weight", lambda t: t / 0))),
    Case("weights-int32", (*SG, *OUT), 2, "has dtype int32, expected float32, bfloat16 or float16",
         build=lambda r: edit_tensors(_weights(r), set_tensor("norm.weight", lambda t: t.to(torch.int32)))),
    Case("weights-fp8", (*SG, *OUT), 2, "has dtype float8_e4m3fn",
         build=lambda r: edit_tensors(_weights(r), set_tensor("fc.weight", lambda t: t.to(torch.float8_e4m3fn)))),
    Case("index-not-json", (*SG, *OUT), 2, "model.safetensors.index.json",
         build=lambda r: _index(r, "{bad")),
    Case("index-missing-shard", (*SG, *OUT), 2, "lists shard 'gone.safetensors'",
         build=lambda r: _index(r, json.dumps({"weight_map": {"fc.weight": "gone.safetensors"}}))),
    # ---- SRC: a `dflash train` state ---------------------------------------------------------------
    Case("state-empty-object", ("{root}/run/train_state", "--to", "trtllm", *OUT), 2, "has no meta.drafter object",
         build=lambda r: train_state(r, {})),
    Case("state-not-json", ("{root}/run/train_state", "--to", "trtllm", *OUT), 2, "state.json is not valid JSON",
         build=lambda r: train_state(r, text='{"meta": ')),
    Case("state-list", ("{root}/run/train_state", "--to", "trtllm", *OUT), 2, "state.json holds a JSON array",
         build=lambda r: train_state(r, [1])),
    Case("state-drafter-string", ("{root}/run/train_state", "--to", "trtllm", *OUT), 2, "has no meta.drafter",
         build=lambda r: train_state(r, {"meta": {"drafter": "qwen"}})),
    Case("state-drafter-bad-field", ("{root}/run/train_state", "--to", "trtllm", *OUT), 2, "num_attention_heads",
         build=lambda r: drafter_config_state(r, num_attention_heads=-1)),
    Case("state-no-weights", ("{root}/run/train_state", "--to", "trtllm", *OUT), 2, "model.safetensors",
         build=lambda r: os.unlink(train_state(r) / "model.safetensors")),
    # ---- --target-model: config, tokenizer, LM head ------------------------------------------------
    Case("target-missing", (*SG, "--target-model", "{root}/nothing", *OUT), 2, "nothing is not a directory"),
    Case("target-no-config", (*SG, *TM, *OUT), 2, "target is not a Hugging Face model directory (no config.json)",
         build=lambda r: os.unlink(_target_config(r))),
    Case("target-config-list", (*SG, *TM, *OUT), 2, "config.json holds a JSON array, expected an object",
         build=lambda r: write_text(_target_config(r), "[1, 2]")),
    Case("target-config-not-json", (*SG, *TM, *OUT), 2, "config.json is not valid JSON (Expecting property name",
         build=lambda r: write_text(_target_config(r), "{bad")),
    Case("target-config-not-utf8", (*SG, *TM, *OUT), 2, "config.json is not UTF-8 text",
         build=lambda r: write_bytes(_target_config(r), b"{\"a\": \"\xff\"}")),
    Case("target-config-empty", (*SG, *TM, *OUT), 2, "config.json lacks hidden_size, expected a positive integer",
         build=lambda r: write_text(_target_config(r), "{}")),
    Case("target-hidden-string", (*SG, *TM, *OUT), 2, 'hidden_size is "abc", expected a positive integer',
         build=lambda r: edit_json(_target_config(r), hidden_size="abc")),
    Case("target-layers-zero", (*SG, *TM, *OUT), 2, "num_hidden_layers is 0, expected a positive integer",
         build=lambda r: edit_json(_target_config(r), num_hidden_layers=0)),
    Case("target-text-config-list", (*SG, *TM, *OUT), 2, "text_config holds a JSON array",
         build=lambda r: edit_json(_target_config(r), text_config=[])),
    Case("target-positions-string", (*SG, *TM, *OUT), 2, 'max_position_embeddings is "big"',
         build=lambda r: edit_json(_target_config(r), max_position_embeddings="big")),
    Case("target-tie-string", (*SG, *TM, *OUT), 2, 'tie_word_embeddings is "yes", expected true or false',
         build=lambda r: edit_json(_target_config(r), tie_word_embeddings="yes")),
    Case("target-block-beyond-positions", (*SG, *TM, *OUT), 2, "block_size is 8 but the target",
         build=lambda r: edit_json(_target_config(r), max_position_embeddings=4)),
    Case("target-hidden-mismatch", (*SG, *TM, *OUT), 2, "hidden_size is 32 but the target's is 48",
         build=lambda r: edit_json(_target_config(r), hidden_size=48)),
    Case("target-tokenizer-corrupt", (*SG, *TM, *OUT), 2, "its tokenizer cannot be loaded",
         build=lambda r: write_text(r / "target" / "tokenizer.json", "{bad")),
    Case("lm-head-truncated", LM, 2, "target/model.safetensors is truncated",
         build=lambda r: truncate(_target_weights(r), 100)),
    Case("lm-head-wrong-shape", LM, 2, "tensor 'lm_head.weight' has shape [300, 16], expected [vocab_size",
         build=lambda r: edit_tensors(_target_weights(r), set_tensor("lm_head.weight",
                                                                     lambda t: t[:, :16].contiguous()))),
    Case("lm-head-nan", LM, 2, "tensor 'lm_head.weight' holds NaN or infinite values",
         build=lambda r: edit_tensors(_target_weights(r), set_tensor("lm_head.weight", lambda t: t * float("nan")))),
    Case("lm-head-no-target", ("{drafter}", "--to", "onnx", "--with-lm-head", *OUT), 2, "needs --target-model"),
]
