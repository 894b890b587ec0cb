"""`python -m dflash_demo.dev_score`: teacher-forced acceptance on a dev set no stage trains on."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from dflash_core.model.drafter import load_drafter
from dflash_core.loading import load_target
from dflash_core.training.batches import make_batch
from dflash_core.training.objective import TrainingObjective
from dflash_core.training.trainer import load_data
from dflash_demo.build import Continuation, DemoRecipe, build_data, write_jsonl
from dflash_demo.dev_score import ANCHORS, DEV_FIRST, SEED, dev_score, main, write_dev_prompts

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "models" / "demo"


@pytest.fixture(scope="module")
def dev_data(tmp_path_factory):
    """The demo target's greedy and sampled responses (16 tokens) to two held-out prompts, in fp32."""
    work = tmp_path_factory.mktemp("dev")
    prompts = work / "prompts.jsonl"
    write_jsonl(prompts, [json.loads(line) for line in (DEMO / "heldout.jsonl").read_text().splitlines()[:2]])
    target = load_target(DEMO / "target", (), "fp32")
    recipe = replace(DemoRecipe(), response_tokens=16)
    return build_data(work, DEMO, prompts, recipe, kind="both", prompt_range=(0, 2), loaded=(target, False))


def test_score_is_the_training_objectives_estimate_over_the_same_blocks(dev_data):
    target = load_target(DEMO / "target", (), "fp32")
    score = dev_score(target, DEMO / "drafter", load_data(dev_data), autocast_bf16=False)
    data = load_data(dev_data)
    drafter = load_drafter(DEMO / "drafter", dtype=torch.float32)
    batch = make_batch(data, range(len(data)), anchors=ANCHORS, block_size=16, max_length=1024, seed=SEED)
    positions = torch.arange(batch.tokens.shape[1]).expand_as(batch.tokens)
    with torch.no_grad():
        features = target(batch.tokens, positions, None, batch.valid.long()).features
        _, stats = TrainingObjective(drafter, target, gamma=7.0)(features, batch)
    assert score["sequences"] == 4 and score["blocks"] == int(batch.anchor_valid.sum()) > 0
    assert score["tau_est"] == pytest.approx(stats["tau_est"], abs=1e-4)
    assert score["acc1"] == pytest.approx(stats["acc1"], abs=1e-4)
    assert 1.0 <= score["tau_est"] <= score["committed"] <= 16.0


def test_cli_scores_drafters_and_writes_json(dev_data, tmp_path, capsys):
    out = tmp_path / "scores.json"
    assert main(["score", "--data", str(dev_data), str(DEMO / "drafter"), "--limit", "2", "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["anchors"] == ANCHORS and len(written["scores"]) == 1
    assert written["scores"][0]["sequences"] == 2
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == written["scores"][0]


def test_a_missing_drafter_is_refused_in_one_line_before_anything_loads(dev_data, tmp_path, capsys):
    with pytest.raises(SystemExit) as refused:
        main(["score", "--data", str(dev_data), str(tmp_path / "nowhere")])
    assert refused.value.code == 2
    assert "nowhere: expected drafter directories" in capsys.readouterr().err


def test_dev_prompts_lie_past_every_stage_and_a_recipe_reaching_them_is_refused(tmp_path):
    assert DemoRecipe().prompt_pool <= DEV_FIRST
    reaching = replace(DemoRecipe(), continuations=(
        Continuation("far", data="both", steps=1, learning_rate=1e-4, distill="mix", prompts=(0, DEV_FIRST + 1)),))
    with pytest.raises(ValueError, match="past the dev set's first"):
        write_dev_prompts(tmp_path / "dev.jsonl", 2, reaching)
    assert not (tmp_path / "dev.jsonl").exists()
