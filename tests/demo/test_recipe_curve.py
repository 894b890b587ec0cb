"""The recipe curve: fits by hand, predictions by hand, the committed record readable, bad records refused."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from dflash_core.errors import DataError
from dflash_demo.recipe_curve import Fit, Stage, fit_curves, least_squares, main, predictions, read_stages

RECORD = Path(__file__).resolve().parents[2] / "docs/results/recipe_stages.json"


def _record(path, stages):
    path.write_text(json.dumps({"stages": stages}))
    return path


def test_least_squares_hand_computed():
    a, b, r2 = least_squares([1, 2, 3], [1, 3, 2])  # means 2, 2; slope 1/2
    assert (a, b) == pytest.approx((1.0, 0.5)) and r2 == pytest.approx(0.25)
    assert least_squares([0, 1], [2, 4]) == pytest.approx((2.0, 2.0, 1.0))
    with pytest.raises(ValueError, match="same step"):
        least_squares([3, 3], [1, 2])


def test_fits_recover_exact_curves_and_their_goals():
    # tau = 1 + 0.5 ln S exactly at S = 100, 200, 400 (plus one stage that measured only T=1: not fitted)
    stages = [Stage(f"s{i}", "", s, s, 30.0, {"fp32": {"T=0": 1 + 0.5 * math.log(s)}}) for i, s in enumerate((100, 200, 400))]
    stages.append(Stage("t1", "", 400, 800, 30.0, {"fp32": {"T=1": 1.5}}))
    log, line = fit_curves(stages)
    assert (log.a, log.b, log.r2) == pytest.approx((1.0, 0.5, 1.0))
    assert log.steps_to(4.0) == pytest.approx(math.exp(6.0)) and log.at(400) == pytest.approx(1 + 0.5 * math.log(400))
    assert line.r2 < 1.0 and Fit("linear", 1.0, -0.1, 1.0).steps_to(5.0) is None


def test_predictions_count_stages_and_hours_from_the_last_stage():
    last = Stage("last", "", 650, 10_000, 36.0, {"fp32": {"T=0": 3.0}})
    fit = Fit("linear", 2.0, 1e-4, 1.0)  # tau 5 at S = 30,000: 20,000 more steps
    (row,) = predictions([fit], last, [5.0])
    assert row == {"fit": "linear", "goal": 5.0, "total_steps": 30_000, "more_stages": 31, "more_train_hours": 18.6}
    (never,) = predictions([Fit("log-linear", 2.0, 0.0, 0.0)], last, [5.0])
    assert never["total_steps"] is None and never["more_stages"] is None


def test_read_stages_accumulates_steps_and_refuses_bad_entries(tmp_path):
    path = _record(tmp_path / "r.json", [{"name": "a", "steps": 10, "tau": {"fp32": {"T=0": 2.0}}},
                                         {"name": "b", "steps": 5, "tau": {"fp32": {"T=0": 2.5}}, "train_minutes": 3}])
    assert [(s.name, s.total_steps, s.minutes) for s in read_stages(path)] == [("a", 10, 0.0), ("b", 15, 3.0)]
    for bad, message in (([{"steps": 0, "tau": {}}], "'steps' must be a positive integer"),
                         ([{"steps": 5, "tau": {"fp32": {"T=0": 0.5}}}], "'tau' must map"),
                         ([], "non-empty list")):
        with pytest.raises(DataError, match=message):
            read_stages(_record(tmp_path / "bad.json", bad))


def test_cli_on_the_committed_record_writes_the_report(tmp_path, capsys):
    assert main(["--stages", str(RECORD), "--out", str(tmp_path), "--goals", "5"]) == 0
    report = json.loads((tmp_path / "recipe_curve.json").read_text())
    stages = report["data"]["stages"]
    assert stages[0]["name"] == "drafter_run" and all(b["total_steps"] > a["total_steps"] for a, b in zip(stages, stages[1:]))
    assert {f["kind"] for f in report["data"]["fits"]} == {"log-linear", "linear"}
    assert all(p["total_steps"] > stages[-1]["total_steps"] for p in report["data"]["predictions"])  # tau 5 is ahead
    assert (tmp_path / "recipe_curve.md").is_file() and (tmp_path / "recipe_curve.png").stat().st_size > 0


def test_cli_errors_are_one_line(tmp_path):
    with pytest.raises(SystemExit, match="is not a stage of"):
        main(["--stages", str(RECORD), "--out", str(tmp_path), "--fit-from", "nope"])
    with pytest.raises(SystemExit, match="'steps' must be a positive integer"):
        main(["--stages", str(_record(tmp_path / "r.json", [{"steps": -1, "tau": {}}])), "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="expected comma-separated numbers"):
        main(["--stages", str(RECORD), "--out", str(tmp_path), "--goals", "five"])
    assert not (tmp_path / "recipe_curve.json").exists()
