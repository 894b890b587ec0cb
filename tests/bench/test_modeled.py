"""Decoding priced by the cost table: the decoder's step log, the pricing, and the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dflash_bench.modeled import SOURCES, main, modeled_decode, step_seconds
from dflash_core.model.config import DFlashConfig
from dflash_core.decode.loop import generate
from dflash_core.tuning.cost_table import VerifyCostTable
from dflash_core.loading import encode_prompt, load_pair
from dflash_core.decode.profiling import DecodeProfile, StepRecord
from tiny import drafter_config, save_tiny_pair, tiny_drafter, tiny_target

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "import os\n\n\ndef list_files(path):\n    \"\"\"Return the files"


@pytest.fixture(scope="module")
def demo_pair():
    return load_pair(ROOT / "models/demo/target", ROOT / "models/demo/drafter", dtype="fp32")


def test_the_step_log_is_every_step_generate_took(demo_pair):
    prompt = encode_prompt(demo_pair.tokenizer, PROMPT, "cpu")
    profile = DecodeProfile(step_log=[])
    result = generate(demo_pair.target, demo_pair.drafter, prompt, max_new_tokens=64, profile=profile)
    log = profile.step_log
    assert len(log) == profile.steps == len(result.acceptance_lengths[0]) > 0
    assert {record.source for record in log} <= set(SOURCES)
    assert sum(record.source == "lookup" for record in log) == profile.lookup_steps
    assert [record.committed[0] for record in log] == result.acceptance_lengths[0]
    assert all(1 <= record.committed[0] <= record.drafts + 1 for record in log)
    fixed = DecodeProfile(step_log=[])
    generate(demo_pair.target, demo_pair.drafter, prompt, max_new_tokens=32, draft_length=3, context_lookup=False,
             tree="off", profile=fixed)
    assert {(record.source, record.drafts) for record in fixed.step_log[:-1]} == {("drafter", 3)}
    plain = DecodeProfile(step_log=[])
    result = generate(demo_pair.target, demo_pair.drafter, prompt, max_new_tokens=12, draft_length=0, profile=plain)
    assert [(r.source, r.drafts, r.committed) for r in plain.step_log] == [("plain", 0, (1,))] * 11


def test_a_batch_step_records_each_active_row():
    model = tiny_target(vocab=48, layers=3, seed=1)
    drafter = tiny_drafter(drafter_config(model, block_size=4), seed=1)
    profile = DecodeProfile(step_log=[])
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    result = generate(model, drafter, ids, max_new_tokens=10, draft_length=2, profile=profile)
    assert {len(record.committed) for record in profile.step_log} == {2}
    assert [record.committed[1] for record in profile.step_log] == result.acceptance_lengths[1]


def test_each_step_is_charged_what_the_table_says():
    costs = VerifyCostTable(seconds=(1.0, 1.2, 1.4, 1.6), draft_s=0.5, head_s=0.1)
    assert step_seconds(StepRecord("plain", 0, (1,)), costs) == pytest.approx(1.0)
    assert step_seconds(StepRecord("lookup", 3, (2,)), costs) == pytest.approx(1.6)  # a copy: no model pass
    assert step_seconds(StepRecord("drafter", 2, (3,)), costs) == pytest.approx(1.4 + 0.5 + 2 * 0.1)
    # two rows, one draft each: a forward over 4 tokens, the pass scaled as a forward over 8 (extended: 2.4) is to 1.6
    assert step_seconds(StepRecord("drafter", 1, (2, 1)), costs) == pytest.approx(1.6 + 0.6 * 2.4 / 1.6)
    # trimmed to no drafts by confidence: the pass was paid
    assert step_seconds(StepRecord("drafter", 0, (1,)), costs) == pytest.approx(1.0 + 0.5)


def test_the_report_compares_drafters_deterministically(tmp_path):
    target_dir, drafter_dir = save_tiny_pair(tmp_path, block_size=4)
    other = tmp_path / "other"
    config = json.loads((drafter_dir / "config.json").read_text())
    tiny_drafter(DFlashConfig.from_pretrained(drafter_dir), seed=7).save_pretrained(other)
    assert json.loads((other / "config.json").read_text()) == config
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("def f(x):", "import os\n", "class A:")))
    out = tmp_path / "out"
    code = main(["--target", str(target_dir), "--drafters", str(drafter_dir), str(drafter_dir), str(other),
                 "--prompts", str(prompts), "--count", "3", "--max-new-tokens", "12", "--dtype", "fp32",
                 "--out", str(out)])
    assert code == 0
    report = json.loads((out / "modeled.json").read_text())
    runs = list(report["data"].values())
    assert len(runs) == 3 and (out / "modeled.md").is_file() and (out / "modeled.png").is_file()
    assert runs[0]["seconds"] == runs[1]["seconds"] and runs[0]["tokens"] == runs[1]["tokens"]  # same weights
    assert report["rows"][1][5] == 1.0  # vs the first drafter
    for run in runs:
        assert run["tokens"] == sum(p["tokens"] for p in run["per_prompt"]) > 0
        assert run["seconds"] == pytest.approx(sum(p["seconds"] for p in run["per_prompt"]))
        assert run["speedup"] == pytest.approx(run["tokens"] * run["costs"]["seconds"][0] / run["seconds"])
        assert sum(run["steps"].values()) == sum(p["steps"] for p in run["per_prompt"])


def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys):
    target_dir, drafter_dir = save_tiny_pair(tmp_path, block_size=4)
    out = tmp_path / "out"
    args = ["--target", str(target_dir), "--drafters", str(drafter_dir), "--out", str(out)]
    assert main(args + ["--prompts", str(tmp_path / "missing.jsonl")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: prompt file") and "does not exist" in error and "\n" not in error
    with pytest.raises(SystemExit) as exit_:
        main(args + ["--prompts", str(tmp_path / "missing.jsonl"), "--count", "0"])
    assert exit_.value.code == 2
    with pytest.raises(SystemExit):
        main(args + ["--prompts", str(tmp_path / "missing.jsonl"), "--draft-length", "many"])
    assert not out.exists()


def test_a_fixed_cost_table_is_reused_and_a_bad_one_refused(tmp_path, capsys):
    target_dir, drafter_dir = save_tiny_pair(tmp_path, block_size=4)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("def f(x):", "import os\n")))
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"seconds": [1.0, 1.1, 1.2, 1.3], "draft_s": 0.4, "head_s": 0.0}))
    base = ["--target", str(target_dir), "--drafters", str(drafter_dir), "--prompts", str(prompts),
            "--max-new-tokens", "10", "--dtype", "fp32"]
    assert main(base + ["--costs", str(table), "--out", str(tmp_path / "a")]) == 0
    first = json.loads((tmp_path / "a/modeled.json").read_text())
    assert next(iter(first["data"].values()))["costs"]["seconds"] == [1.0, 1.1, 1.2, 1.3]
    # an earlier report as the table: the same decisions and prices again
    assert main(base + ["--costs", str(tmp_path / "a/modeled.json"), "--out", str(tmp_path / "b")]) == 0
    again = json.loads((tmp_path / "b/modeled.json").read_text())
    def modeled(report):  # all but the wall-time columns and fields
        return ([row[:6] for row in report["rows"]],
                [{k: v for k, v in run.items() if not k.startswith("measured")} for run in report["data"].values()])

    assert modeled(again) == modeled(first)
    table.write_text(json.dumps({"seconds": [], "draft_s": 0.4}))
    capsys.readouterr()
    assert main(base + ["--costs", str(table), "--out", str(tmp_path / "c")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"error: cost table {table}") and "\n" not in error
    assert not (tmp_path / "c").exists()


def test_the_run_keeps_its_wall_time_beside_the_model(tmp_path):
    target_dir, drafter_dir = save_tiny_pair(tmp_path, block_size=4)
    pair = load_pair(target_dir, drafter_dir, dtype="fp32", drafter_weights="plain")
    run = modeled_decode(pair, ["def f(x):", "import os\n"], max_new_tokens=10)
    assert all(run.measured[name] > 0 for name in ("prefill_s", "decode_s", "verify_s"))
    assert run.measured["decode_s"] >= run.measured["verify_s"]
    assert run.measured_over_modeled == pytest.approx(run.measured["decode_s"] / run.seconds)
