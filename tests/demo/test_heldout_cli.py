"""`python -m dflash_demo.heldout`: the held-out tau behind docs/training.md's tables, as one command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dflash_demo.heldout import kept_by_position, main

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "models" / "demo"


def test_writes_tau_for_the_dtypes_and_temperatures_asked(tmp_path, capsys):
    out = tmp_path / "tau.json"
    assert main(["--target", str(DEMO / "target"), "--drafter", str(DEMO / "drafter"), "--prompts",
                 str(DEMO / "heldout.jsonl"), "--count", "2", "--max-new-tokens", "16", "--dtypes", "fp32",
                 "--temperatures", "0", "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert set(written["tau"]) == {"fp32"} and set(written["tau"]["fp32"]) == {"T=0"}
    assert 1.0 <= written["tau"]["fp32"]["T=0"] <= 16.0 and written["count"] == 2
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == written["tau"]
    kept = written["kept_by_position"]["fp32"]["T=0"]  # tau = 1 + sum_j P(drafts 1..j all kept)
    assert len(kept) == 15 and kept == sorted(kept, reverse=True)
    assert written["tau"]["fp32"]["T=0"] == pytest.approx(1 + sum(kept), abs=2e-3)


def test_kept_by_position_counts_the_steps_that_kept_at_least_j_drafts():
    assert kept_by_position([1, 3, 16, 2], 15) == [0.75, 0.5] + [0.25] * 13
    assert kept_by_position([], 3) == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("flag, value", [("--dtypes", "fp16"), ("--dtypes", ""), ("--temperatures", "-1"),
                                         ("--temperatures", "warm")])
def test_a_bad_list_is_refused_before_anything_loads(tmp_path, capsys, flag, value):
    out = tmp_path / "tau.json"
    with pytest.raises(SystemExit) as refused:
        main(["--target", str(tmp_path / "missing"), "--drafter", str(tmp_path / "missing"), "--prompts",
              str(tmp_path / "missing.jsonl"), flag, value, "--out", str(out)])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert refused.value.code == 2 and f"argument {flag}: {value!r}: expected" in error
    assert not out.exists()
