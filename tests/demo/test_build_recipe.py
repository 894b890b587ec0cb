"""The demo recipe's continuation stages: prompt ranges, and how they scale to fewer training prompts."""

from __future__ import annotations

import json

import pytest
from dflash_demo.build import Continuation, DemoRecipe, build_data


def test_continuations_chain_and_fresh_sampled_prompts():
    stages = DemoRecipe().continuations
    assert len({stage.name for stage in stages}) == len(stages)
    sampled = [stage.prompts for stage in stages if stage.data == "both"]
    sets = [(first, first + 1500) for first in range(15000, 36000, 1500)]
    assert sampled[0] == (0, 1500) and sampled[-43] == (13500, 15000)
    assert sampled[-42:] == sets * 3  # fresh sets, then a second and a third pass over each
    assert all(0 <= first < stop <= DemoRecipe().prompt_pool for first, stop in sampled)
    assert DemoRecipe().prompt_pool == 36000  # past the base stage's 6,000: fresh prompts for the later stages
    assert all(stage.learning_rate == 1e-4 for stage in stages[-43:]) and stages[-44].learning_rate == 3e-4


def test_scaled_recipe_keeps_each_range_in_proportion():
    recipe = DemoRecipe(continuations=(Continuation("a", "both", 5, 1e-4, "mix", prompts=(1500, 3000)),))
    small = recipe.scaled_to(600)
    assert small.train_prompts == 600 and small.continuations[0].prompts == (150, 300)
    assert small.continuations[0].steps == 5 and recipe.continuations[0].prompts == (1500, 3000)  # the original is untouched


def test_greedy_stages_carry_no_prompt_range_and_a_sampled_stage_needs_one(tmp_path):
    recipe = DemoRecipe()
    assert all((stage.prompts is None) == (stage.data == "greedy") for stage in recipe.continuations)
    assert all((stage.prompts is None) == (stage.data == "greedy") for stage in recipe.scaled_to(4).continuations)
    prompts = tmp_path / "train_prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "def f():"}) + "\n")
    with pytest.raises(ValueError, match="needs a prompt range"):
        build_data(tmp_path / "work", tmp_path / "missing_models", prompts, recipe, kind="both")
    assert not (tmp_path / "work").exists()


@pytest.mark.parametrize("prompt_range", [(2, 2), (3, 9), (-1, 2)])
def test_an_empty_or_outside_prompt_range_is_refused_before_anything_loads(tmp_path, prompt_range):
    prompts = tmp_path / "train_prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"def f{i}():"}) + "\n" for i in range(4)))
    with pytest.raises(ValueError, match=r"prompt range .* outside the 4 training prompts"):
        build_data(tmp_path / "work", tmp_path / "missing_models", prompts, DemoRecipe(), kind="both",
                   prompt_range=prompt_range)
    assert not (tmp_path / "work").exists()


def test_the_prompt_pool_covers_every_stage_and_grows_without_moving_a_prompt(tmp_path):
    from dflash_demo.build import build_prompts
    from dflash_demo.corpus import split_corpus
    from dflash_demo.prompts import code_prompts

    recipe = DemoRecipe(heldout_prompts=2, train_prompts=6, continuations=(
        Continuation("a", "both", 5, 1e-4, "mix", prompts=(0, 6)),
        Continuation("b", "both", 5, 1e-4, "mix", prompts=(6, 9))))
    assert recipe.prompt_pool == 9 and DemoRecipe().prompt_pool >= DemoRecipe().train_prompts
    assert recipe.scaled_to(2).prompt_pool == 3  # (6, 9) of 6 is (2, 3) of 2
    split = split_corpus()
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    first = code_prompts(split, split.train, 6, seed=2)
    (work / "train_prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in first))
    train, heldout = build_prompts(work, out, recipe)  # an older, shorter pool is extended
    rows = [json.loads(line) for line in train.read_text().splitlines()]
    assert len(rows) == 9 and rows[:6] == first  # the prompts drawn before keep their places
    assert not {p["source"].rsplit(":", 1)[0] for p in rows} & set(split.heldout)
    assert len(heldout.read_text().splitlines()) == 2
