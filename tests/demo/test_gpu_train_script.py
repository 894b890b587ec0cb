"""The GPU training script runs the demo recipe from the source tree alone (here on the CPU, tiny)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from dflash_core.loading import load_pair

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_train_script_writes_a_drafter_and_heldout_tau(tmp_path):
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "DEVICE": "cpu", "TRAIN_PROMPTS": "4",
           "RESPONSE_TOKENS": "24", "EPOCHS": "1", "CONTINUE_STEPS": "2", "EVAL_PROMPTS": "2", "EVAL_TOKENS": "8",
           "BUDGET_MIN": "60", "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(ROOT / "tools/demo/gpu/train_drafter.sh"), str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = json.loads((out / "tau.json").read_text())
    for dtype in ("fp32", "bf16"):
        for temperature in ("T=0", "T=1"):
            assert 1.0 <= summary["tau"][dtype][temperature] <= 16.0
    assert summary["heldout_prompts"] == 2 and summary["recipe"]["train_prompts"] == 4
    assert summary["budget"] == {"minutes": 60.0, "continuations_run": 64, "first_skipped": None}
    assert set(summary["seconds"]) == {"prompts_s", "data_s", "train_s", "continue_s", "tau_s", "total_s"}
    log = (out / "log.txt").read_text()
    assert all(f"{stage}: " in log for stage in ("prompts_s", "data_s", "train_s", "continue_s", "tau_s"))
    # the continuations ran in order, each from the one before, on greedy then greedy + sampled data
    work = out / "work"
    stages = summary["recipe"]["continuations"]
    assert [stage["data"] for stage in stages] == ["greedy"] + ["both"] * 63
    # each 1,500 of 6,000 (and 6,000-36,000) scaled to 4: the early stages, then 15,000-36,000 three times over
    assert [stage["prompts"] for stage in stages][1:] == (
        [[0, 1]] * 2 + [[1, 2]] * 3 + [[2, 3]] * 2 + [[3, 4]] * 2 + [[4, 5]] * 2 + [[5, 6]] * 2 + [[6, 7]] * 2
        + [[7, 8]] * 2 + [[8, 9]] * 2 + [[9, 10]] * 2 + [[first, first + 1] for first in range(10, 24)] * 3)
    previous = work / "drafter_run"
    for stage in stages:
        config = json.loads((work / stage["name"] / "train_state" / "state.json").read_text())["meta"]["train"]
        assert config["init_from"] == str(previous) and config["max_steps"] == 2 and config["distill"] == stage["distill"]
        assert config["learning_rate"] == stage["learning_rate"]  # 3e-4, then 1e-4 for the last forty-three stages
        previous = work / stage["name"]
    for first in range(24):  # every sampled range, [0, 1) to [23, 24)
        both = json.loads((work / f"data_both_{first}_{first + 1}" / "index.json").read_text())["settings"]
        assert both["responses"] == "both" and both["temperature"] == 1.0
    pair = load_pair(ROOT / "models/demo/target", work / "drafter", dtype="fp32")  # the published format
    assert pair.drafter.config.block_size == 16
    published = work / "drafter" / "model.safetensors"
    assert published.read_bytes() == (previous / "model.safetensors").read_bytes()
    assert (work / "drafter" / "draft_vocab.json").read_bytes() == (work / "drafter_run" / "draft_vocab.json").read_bytes()


def test_stage_budget_prices_the_next_stage_at_the_last_ones_time():
    from dflash_demo.build import Continuation
    from dflash_demo.gpu_train import StageBudget

    stage = Continuation("s", data="both", steps=1, learning_rate=1e-4, distill="mix", prompts=(0, 1))
    budget = StageBudget(time.perf_counter(), usable_s=100.0)
    assert budget(stage, 0.0) and budget(stage, 60.0)  # the first stage, then one priced at 60 s: both fit
    assert not budget(replace(stage, name="late"), 120.0)  # priced past 100 s
    assert budget.summary(8) == {"minutes": 8, "continuations_run": 2, "first_skipped": "late"}
    # the first continuation has no stage before it: priced at what the base run's steps took, not at nothing
    priced = StageBudget(time.perf_counter(), usable_s=100.0, first_s=120.0)
    assert not priced(stage, 0.0) and priced.first_skipped == "s"
    assert StageBudget(time.perf_counter(), usable_s=100.0, first_s=50.0)(stage, 0.0)


def test_gpu_train_script_out_of_budget_publishes_the_base_drafter(tmp_path):
    """A budget spent before the first continuation: none runs, the base drafter is published and measured."""
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "DEVICE": "cpu", "TRAIN_PROMPTS": "4",
           "RESPONSE_TOKENS": "16", "EPOCHS": "1", "EVAL_PROMPTS": "1", "EVAL_TOKENS": "4", "BUDGET_MIN": "0",
           "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(ROOT / "tools/demo/gpu/train_drafter.sh"), str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = json.loads((out / "tau.json").read_text())
    assert summary["budget"] == {"minutes": 0.0, "continuations_run": 0, "first_skipped": "greedy_run"}
    assert "budget: greedy_run would end past" in (out / "log.txt").read_text()
    work = out / "work"
    assert not (work / "greedy_run").exists() and not list(work.glob("data_both_*"))
    assert (work / "drafter" / "model.safetensors").read_bytes() == (work / "drafter_run" / "model.safetensors").read_bytes()
    assert 1.0 <= summary["tau"]["fp32"]["T=0"] <= 16.0


def test_smollm2_gpu_script_runs_the_chat_recipe_from_the_source_tree(tmp_path):
    """The real pair's GPU script, on a tiny random target given a chat template (SmolLM2 itself would take minutes)."""
    from tiny import save_tiny_pair
    from transformers import AutoTokenizer

    target, _ = save_tiny_pair(tmp_path / "models")
    tokenizer = AutoTokenizer.from_pretrained(target)
    tokenizer.chat_template = (ROOT / "tests/plugins/chat_template.jinja").read_text()
    tokenizer.save_pretrained(target)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "DEVICE": "cpu", "TARGET": str(target),
           "MASK_TOKEN": "<|MASK|>", "PROMPTS": "3", "TOKENS": "12", "DATA_BATCH": "3", "EPOCHS": "1",
           "EVAL_PROMPTS": "2", "EVAL_TOKENS": "6", "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(ROOT / "tools/demo/gpu/train_smollm2.sh"), str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = json.loads((out / "tau.json").read_text())
    assert summary["count"] == 2 and set(summary["tau"]) == {"fp32", "bf16"}
    assert all(1.0 <= tau <= 16.0 for by_t in summary["tau"].values() for tau in by_t.values())
    assert "messages" in (out / "prompts.jsonl").read_text().splitlines()[0]
    log = (out / "log.txt").read_text()
    assert "data:" in log and "train:" in log and "held-out tau:" in log
    # without a target: one line and exit 2 before anything runs
    env["TARGET"] = str(tmp_path / "missing")
    done = subprocess.run(["bash", str(ROOT / "tools/demo/gpu/train_smollm2.sh"), str(tmp_path / "x")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "make real-model" in done.stderr and not (tmp_path / "x").exists()
