"""The GPU benchmark script runs from the source tree alone (here on the CPU, tiny settings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_bench_script_runs_from_the_source_tree(tmp_path):
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "DEVICE": "cpu", "PROMPTS": "1", "TOKENS": "6",
           "BATCHES": "1", "REPEATS": "1", "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", str(ROOT / "tools/bench/gpu/run_bench.sh"), str(tmp_path / "out")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = tmp_path / "out"
    assert {"e2e_bf16.json", "e2e_bf16.md", "e2e_fp32.json", "e2e_fp32.md", "step_cost_fp32.json",
            "step_cost_bf16.json", "log.txt"} <= {p.name for p in out.iterdir()}
    for dtype in ("bf16", "fp32"):  # one benchmark per dtype, so a run stopped part-way keeps the first
        results = json.loads((out / f"e2e_{dtype}.json").read_text())["data"]["results"]
        assert {row["dtype"] for row in results} == {dtype}
        methods = {row["method"] for row in results}
        assert methods >= {"ar", "dflash", "dflash_full", "prompt_lookup", "assisted"}  # the CPU benchmark's peers


def test_one_lease_script_runs_the_benchmark_then_the_recipe_and_bundles_both(tmp_path):
    """tools/gpu/run_all.sh: both GPU scripts in one budget, the results in two files small enough to fetch."""
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "DEVICE": "cpu", "PROMPTS": "1", "TOKENS": "6",
           "BATCHES": "1", "REPEATS": "1", "TRAIN_PROMPTS": "4", "RESPONSE_TOKENS": "16", "EPOCHS": "1",
           "CONTINUE_STEPS": "1", "EVAL_PROMPTS": "1", "EVAL_TOKENS": "4", "TOTAL_MIN": "5",
           "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    work, bundle = tmp_path / "work", tmp_path / "bundle"
    done = subprocess.run(["bash", str(ROOT / "tools/gpu/run_all.sh"), str(work), str(bundle)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert sorted(p.name for p in bundle.iterdir()) == ["results.tgz", "summary.txt"]
    summary = (bundle / "summary.txt").read_text()
    assert "bench: exit 0" in summary and "train: exit 0" in summary and "held-out tau:" in summary
    assert "e2e bf16 batch 1 dflash:" in summary and "e2e fp32 batch 1 assisted:" in summary
    with tarfile.open(bundle / "results.tgz") as bundled:
        names = set(bundled.getnames())
    assert {"summary.txt", "bench/e2e_bf16.json", "bench/e2e_fp32.json", "bench/log.txt", "train/tau.json",
            "train/log.txt", "train/work/drafter/model.safetensors"} <= names
    assert not any("cache" in name or "train_state" in name or "/data" in name for name in names)
    assert (bundle / "results.tgz").stat().st_size < 16 * 2**20  # what a lease can bring back in one file


def test_one_lease_script_refuses_a_budget_that_is_not_whole_minutes(tmp_path):
    """BENCH_MIN=0 would hand `timeout` a 0, i.e. no limit: refused in one line before anything runs."""
    for bad in ({"BENCH_MIN": "0"}, {"TOTAL_MIN": "2.5"}):
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHON": sys.executable} | bad
        done = subprocess.run(["bash", str(ROOT / "tools/gpu/run_all.sh"), str(tmp_path / "work")], env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "expected whole minutes" in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "work").exists()

