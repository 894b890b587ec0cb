"""The GPU benchmark script runs from the source tree alone (here on the CPU, tiny settings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_bench_script_runs_from_the_source_tree(tmp_path):
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "DEVICE": "cpu", "PROMPTS": "1", "TOKENS": "6",
           "BATCHES": "1", "REPEATS": "1", "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", str(ROOT / "tools/bench/gpu/run_bench.sh"), str(tmp_path / "out")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = tmp_path / "out"
    assert {"e2e.json", "e2e.md", "step_cost_fp32.json", "step_cost_bf16.json", "log.txt"} <= {
        p.name for p in out.iterdir()}
    results = json.loads((out / "e2e.json").read_text())
    methods = {row["method"] for row in results["data"]["results"]}
    assert methods >= {"ar", "dflash", "dflash_full", "prompt_lookup", "assisted"}  # the CPU benchmark's peers
