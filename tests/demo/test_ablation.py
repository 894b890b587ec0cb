"""The issue-9 ablation and learning-curve driver end to end on a tiny random target: real training runs,
real held-out tau (the demo target would make the same runs minutes long)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_core.loading import load_target, load_tokenizer
from dflash_core.training.data import DataSettings, generate_responses, prompts_fingerprint, target_fingerprint
from dflash_core.training.trainer import data_fingerprint, load_data
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
                            responses="greedy", max_new_tokens=20, seed=0, shard_size=1)
    target = load_target(target_dir, (), "fp32")
    generate_responses(target.model, load_tokenizer(target_dir), prompts, root / "data", settings, batch_size=1)
    return root, models


def _main(root: Path, models: Path, *extra: str) -> int:
    return ablation.main(["--models", str(models), "--data", str(root / "data"), "--work", str(root / "work"),
                          "--out", str(root / "out"), "--eval-prompts", "1", "--eval-tokens", "4", *extra])


def test_levers_train_for_the_same_budget_and_report_heldout_tau(models_and_data):
    root, models = models_and_data
    # timed round-robin on one shared target: each lever's step must read its own feature layers
    assert _main(root, models, "--only", "baseline,depth-2,features-3", "--budget-s", "3") == 0
    rows = json.loads((root / "out/ablation.json").read_text())["data"]["rows"]
    assert [r["lever"] for r in rows] == ["baseline", "depth-2", "features-3"]
    for r in rows:
        assert r["steps"] >= 1 and 1.0 <= r["tau"] <= 16.0 and r["seconds_per_step"] > 0
    assert (root / "out/ablation.md").read_text().count("| depth-2 |") == 1
    times = json.loads((root / "work/budget-3s/step_times.json").read_text())
    assert {r["lever"]: r["seconds_per_step"] for r in rows} == {k: round(v, 3) for k, v in times.items()}
    # a second run resumes: the step counts and timings chosen the first time are kept, nothing is re-timed
    assert _main(root, models, "--only", "baseline", "--budget-s", "3") == 0
    again = json.loads((root / "out/ablation.json").read_text())["data"]["rows"][0]
    assert again["steps"] == rows[0]["steps"] and again["seconds_per_step"] == rows[0]["seconds_per_step"]
    assert json.loads((root / "work/budget-3s/step_times.json").read_text()) == times


def test_a_lever_added_later_is_timed_beside_the_baseline_and_scaled(models_and_data, monkeypatch):
    root, models = models_and_data
    budget = root / "work/budget-5s"
    budget.mkdir(parents=True)
    (budget / "step_times.json").write_text(json.dumps({"baseline": 2.0, "soft": 3.0}))
    timed_now = []

    def machine_twice_as_slow_now(setup, names, recipe, scratch):  # what the round-robin timing measures today
        timed_now.append(names)
        return {"baseline": 4.0, "depth-2": 10.0}

    monkeypatch.setattr(ablation, "time_levers", machine_twice_as_slow_now)
    setup = ablation._Setup(models, root / "data", "cpu", 1, 4)
    times = ablation.step_times(setup, ["soft", "depth-2"], ablation.DemoRecipe(), budget, root / "scratch")
    assert timed_now == [["baseline", "depth-2"]]  # only the new lever, beside the baseline
    assert times == {"baseline": 2.0, "soft": 3.0, "depth-2": 5.0}  # 10 s now x (2 s stored / 4 s now)
    assert json.loads((budget / "step_times.json").read_text()) == times


def test_learning_curve_reports_tau_against_training_tokens(models_and_data):
    root, models = models_and_data
    assert _main(root, models, "--curve", "baseline", "--curve-steps", "2", "--eval-every", "1") == 0
    points = json.loads((root / "out/learning_curve.json").read_text())["data"]["points"]
    assert [p["step"] for p in points][:2] == [1, 2] and all(p["tokens"] > 0 and p["tau"] >= 1 for p in points)
    assert points[1]["tokens"] == 2 * points[0]["tokens"]


def test_finished_curves_compare_step_by_step(models_and_data, tmp_path):
    root, models = models_and_data
    for lever, steps in (("baseline", 2), ("features-6", 1)):
        assert _main(root, models, "--curve", lever, "--curve-steps", str(steps), "--eval-every", "1",
                     "--out", str(tmp_path / lever)) == 0
    spec = f"one layer={tmp_path / 'baseline'},all six={tmp_path / 'features-6'}"
    assert ablation.main(["--compare", spec, "--out", str(tmp_path / "cmp"), "--name", "curves"]) == 0
    report = json.loads((tmp_path / "cmp/curves.json").read_text())
    taus = {label: [p["tau"] for p in c["points"]] for label, c in report["data"]["curves"].items()}
    assert len(taus["one layer"]) == 2 and len(taus["all six"]) == 1
    assert [row[0] for row in report["rows"]] == [1, 2] and report["rows"][1][2] == ""  # features-6 stopped at 1
    assert report["rows"][0][1] == f"{taus['one layer'][0]:.2f}" and (tmp_path / "cmp/curves.png").exists()
    with pytest.raises(SystemExit, match="not LABEL=DIR"):
        ablation.main(["--compare", str(tmp_path / "baseline"), "--out", str(tmp_path / "cmp")])


def test_data_levers_train_on_the_first_shards_and_resume_against_them(models_and_data):
    root, models = models_and_data
    data = load_data(root / "data")
    half = ablation.first_shards(data, 0.5)
    assert len(data.index["shards"]) == 4 and [s["file"] for s in half.index["shards"]] == [
        s["file"] for s in data.index["shards"][:2]]
    assert [list(s.tokens) for s in half.samples] == [list(s.tokens) for s in data.samples[:2]]
    assert data_fingerprint(half) != data_fingerprint(data) and len(data) == 4  # the full set is left as it was
    assert _main(root, models, "--only", "data-half", "--budget-s", "2", "--name", "data_levers") == 0
    row = json.loads((root / "out/data_levers.json").read_text())["data"]["rows"][0]
    state = json.loads((root / "work/budget-2s/data-half/train_state/state.json").read_text())
    assert row["changes"] == {"data": "first 0.5 of the shards"} and state["meta"]["data"] == data_fingerprint(half)


def test_unknown_lever_is_one_line():
    with pytest.raises(SystemExit, match="unknown lever 'wider'"):
        ablation.lever_config("wider", ablation.DemoRecipe())
