"""The code drafter's GPU script runs its recipe from the source tree alone: here on the CPU, on a tiny random target
given a chat template (the 1.5B coder would take hours), through the feature cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tiny import save_tiny_pair
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools/gpu/train_code_drafter.sh"


def _env(tmp_path: Path, target: Path, **extra) -> dict:
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "DEVICE": "cpu", "TARGET": str(target),
            "MASK_TOKEN": "<|MASK|>", "PROMPTS": "3", "TOKENS": "12", "DATA_BATCH": "3", "FEATURE_CANDIDATES": "1,3", "EPOCHS": "1",
            "INTERMEDIATE": "48",
            "ANCHORS": "8", "EVAL_PROMPTS": "2", "EVAL_TOKENS": "6", "PYTHON": sys.executable, "OMP_NUM_THREADS": "1",
            **extra}


def test_code_drafter_script_trains_from_stored_features(tmp_path):
    target, _ = save_tiny_pair(tmp_path / "models", target_layers=6)
    tokenizer = AutoTokenizer.from_pretrained(target)
    tokenizer.chat_template = (ROOT / "tests/plugins/chat_template.jinja").read_text()
    tokenizer.save_pretrained(target)
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(SCRIPT), str(out)], env=_env(tmp_path, target), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = json.loads((out / "tau.json").read_text())
    assert summary["count"] == 2 and set(summary["tau"]) == {"fp32", "bf16"}
    assert all(1.0 <= tau <= 16.0 for by_t in summary["tau"].values() for tau in by_t.values())
    first = json.loads((out / "prompts.jsonl").read_text().splitlines()[0])
    assert first["messages"][0]["role"] == "user" and "subject" in first  # code chats
    index = json.loads((out / "features" / "index.json").read_text())
    assert index["settings"]["layer_ids"] == [1, 2, 3] and index["samples"] == 3
    state = json.loads((out / "drafter" / "train_state" / "state.json").read_text())["meta"]
    assert state["drafter"]["dflash_config"]["target_layer_ids"] == [3] and state["train"]["loss_vocab"] == "list"
    assert state["train"]["intermediate_size"] == 48 and state["drafter"]["intermediate_size"] == 48
    log = (out / "log.txt").read_text()
    assert all(f"{stage}: " in log for stage in ("prompts", "data", "features", "train", "held-out tau"))


def test_code_drafter_script_refuses_a_missing_target_in_one_line(tmp_path):
    env = _env(tmp_path, tmp_path / "missing")
    done = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "x")], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "make code-model" in done.stderr and not (tmp_path / "x").exists()
