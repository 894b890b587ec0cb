"""The issue-9 ablation and learning-curve driver end to end on a tiny random target: real training runs,
real held-out tau (the demo target would make the same runs minutes long)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_core.loading import load_target, load_tokenizer
from dflash_core.training.data import DataSettings, generate_responses, prompts_fingerprint, target_fingerprint
from tiny import save_tiny_pair

from dflash_demo import ablation


@pytest.fixture(scope="module")
def models_and_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("ablation")
    models = root / "models"
    target_dir, _ = save_tiny_pair(models, target_layers=6)
    (models / "heldout.jsonl").write_text(json.dumps({"prompt": "def add(a, b):"}) + "\n")
    prompts = ["def add(a, b):\n", "import os\n\ndef main():\n", "class Point:\n    def __init__(self", "x = [1, 2"]
    settings = DataSettings(target=target_fingerprint(target_dir), prompts=prompts_fingerprint(prompts),
                            responses="greedy", max_new_tokens=20, seed=0)
    target = load_target(target_dir, (), "fp32")
    generate_responses(target.model, load_tokenizer(target_dir), prompts, root / "data", settings, batch_size=4)
    return root, models


def _main(root: Path, models: Path, *extra: str) -> int:
    return ablation.main(["--models", str(models), "--data", str(root / "data"), "--work", str(root / "work"),
                          "--out", str(root / "out"), "--eval-prompts", "1", "--eval-tokens", "4", *extra])


def test_levers_train_for_the_same_budget_and_report_heldout_tau(models_and_data):
    root, models = models_and_data
    assert _main(root, models, "--only", "baseline,depth-2", "--budget-s", "3") == 0
    rows = json.loads((root / "out/ablation.json").read_text())["data"]["rows"]
    assert [r["lever"] for r in rows] == ["baseline", "depth-2"]
    for r in rows:
        assert r["steps"] >= 1 and 1.0 <= r["tau"] <= 16.0 and r["seconds_per_step"] > 0
    assert (root / "out/ablation.md").read_text().count("| depth-2 |") == 1
    # a second run resumes: the step counts chosen the first time are kept, nothing is re-timed
    assert _main(root, models, "--only", "baseline", "--budget-s", "3") == 0
    again = json.loads((root / "out/ablation.json").read_text())["data"]["rows"][0]
    assert again["steps"] == rows[0]["steps"] and again["seconds_per_step"] is None


def test_learning_curve_reports_tau_against_training_tokens(models_and_data):
    root, models = models_and_data
    assert _main(root, models, "--curve", "baseline", "--curve-steps", "2", "--eval-every", "1") == 0
    points = json.loads((root / "out/learning_curve.json").read_text())["data"]["points"]
    assert [p["step"] for p in points][:2] == [1, 2] and all(p["tokens"] > 0 and p["tau"] >= 1 for p in points)
    assert points[1]["tokens"] == 2 * points[0]["tokens"]


def test_unknown_lever_is_one_line():
    with pytest.raises(SystemExit, match="unknown lever 'wider'"):
        ablation.lever_config("wider", ablation.DemoRecipe())
