"""Source-choice replay: both sources' acceptance at every position, replayed as the decoder would decode."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_bench.source_choice import RULES, PositionAcceptance, position_acceptance, replay
from dflash_core.decode.autoregressive import generate_autoregressive
from dflash_core.decode.loop import as_target, generate
from dflash_core.tuning.cost_table import VerifyCostTable
from dflash_core.loading import encode_prompt, load_pair
from tiny import drafter_config, tiny_drafter, tiny_target


ROOT = Path(__file__).resolve().parents[2]


def test_replaying_the_drafter_rule_reproduces_the_decoders_steps():
    # the demo pair: a trained drafter, so steps accept different numbers of drafts. Plain weights: the replay runs
    # the drafter's own fp32 weights, and the decoder's bf16 or fp16 copies (chosen by the CPU) can flip a near-tie
    pair = load_pair(ROOT / "models/demo/target", ROOT / "models/demo/drafter", dtype="fp32", drafter_weights="plain")
    prompt = encode_prompt(pair.tokenizer, "import os\n\n\ndef list_files(path):\n    \"\"\"Return the files", "cpu")
    output = generate_autoregressive(pair.target, prompt, max_new_tokens=48).tokens[0]
    row = position_acceptance(pair.target, pair.drafter, prompt[0].tolist(), output)
    assert len(row.drafter) == len(row.lookup) == len(row.copy) == len(output) == 48
    decoded = generate(pair.target, pair.drafter, prompt, max_new_tokens=48, draft_length=15, context_lookup=False)
    assert decoded.tokens[0] == output  # lossless, and the replay's ground truth
    assert len(set(decoded.acceptance_lengths[0])) >= 3  # a replay that ignored the numbers could not match
    costs = VerifyCostTable(seconds=tuple(1.0 + 0.05 * q for q in range(16)), draft_s=0.2)
    assert replay([row], costs, RULES["drafter"])["lengths"] == [decoded.acceptance_lengths[0]]


def test_lookup_counts_accepted_copy_tokens_on_a_loop():
    model = tiny_target(vocab=48, layers=3, seed=1)
    drafter = tiny_drafter(drafter_config(model, block_size=4), seed=1)
    target = as_target(model, drafter)
    prompt = [7, 8, 9, 7, 8]
    output = [9, 7, 8, 9, 7, 8, 30]  # not the target's own output: the numbers follow `output` whatever it is
    row = position_acceptance(target, drafter, prompt, output)
    # p = last committed token; the copy of the history ...7 8 9 continues 7 8 9 (3 drafts, block 4)
    assert row.copy == [3] * 6 + [0]  # the history ends in a bigram seen before, until "8 30"
    assert row.lookup == [3, 3, 3, 2, 1, 0, 0]  # the loop breaks at 30; nothing follows the last token


def test_replay_charges_each_rule_its_steps_and_the_oracle_bounds_them():
    costs = VerifyCostTable(seconds=(1.0, 1.2, 1.4, 1.6), draft_s=0.5)  # drafter step 2.1, copy of 3: 1.6
    rows = [PositionAcceptance(output_tokens=9, drafter=[3, 0, 0, 0, 1, 0, 0, 0, 0],
                               lookup=[0, 0, 3, 0, 0, 0, 0, 0, 0], copy=[0, 3, 3, 3, 3, 3, 0, 0, 0])]
    drafter = replay(rows, costs, RULES["drafter"])  # p0: 4 tokens; p4: 2; p6: 1; p7: 1 -> 8 tokens, 4 steps
    assert drafter["lengths"] == [[4, 2, 1, 1]] and drafter["tau"] == 2.0
    assert drafter["speedup"] == pytest.approx(8 / (4 * 2.1), abs=1e-3)
    mixed = replay(rows, costs, RULES["lookup_else_drafter"])  # drafter at 0 (4), copies at 4 (1) 5 (1), drafter 6, 7
    assert mixed["lengths"] == [[4, 1, 1, 1, 1]]
    assert mixed["speedup"] == pytest.approx(8 / (3 * 2.1 + 2 * 1.6), abs=1e-3)
    oracle = replay(rows, costs, RULES["oracle"])
    assert all(oracle["speedup"] >= replay(rows, costs, rule)["speedup"] for rule in RULES.values())


def test_the_cli_writes_json_and_a_table_for_every_rule(tmp_path, capsys):
    import json

    from dflash_bench.source_choice import main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "def area(width, height):\n"}) + "\n")
    out = tmp_path / "out"
    assert main(["--target", str(ROOT / "models/demo/target"), "--drafter", str(ROOT / "models/demo/drafter"),
                 "--prompts", str(prompts), "--count", "1", "--max-new-tokens", "12", "--out", str(out)]) == 0
    written = json.loads((out / "source_choice.json").read_text())
    assert [row[0] for row in written["rows"]] == list(RULES)
    assert len(written["data"]["rows"]) == 1 and written["data"]["rows"][0]["output_tokens"] == 12
    assert "| oracle |" in (out / "source_choice.md").read_text()
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["oracle"]["speedup"] >= printed["lookup_else_drafter"]["speedup"]
