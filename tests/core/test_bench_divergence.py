"""The reduced-precision divergence tool: its arithmetic, and no divergence at all in fp32."""

from __future__ import annotations

import json

import pytest
from tiny import save_tiny_pair

from dflash_bench import divergence


def test_rounding_step_is_one_unit_in_the_last_place():
    assert divergence.rounding_step(1.0, "bf16") == 2.0 ** -7
    assert divergence.rounding_step(-12.0, "bf16") == 2.0 ** -4  # 8 <= 12 < 16: step 8 * 2^-7
    assert divergence.rounding_step(3.0, "fp32") == 2.0 ** -22


@pytest.mark.parametrize("a, b, expected", [([1, 2, 3], [1, 2, 3], None), ([1, 2, 3], [1, 5, 3], 1),
                                            ([1, 2], [1, 2, 3], 2), ([4], [5], 0)])
def test_first_divergence(a, b, expected):
    assert divergence.first_divergence(a, b) == expected


def test_fp32_outputs_never_part(tmp_path):
    target, drafter = save_tiny_pair(tmp_path / "pair", block_size=4)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("def main(", "import os\n", "x = [")))
    code = divergence.main(["--target", str(target), "--drafter", str(drafter), "--prompts-file", str(prompts),
                            "--dtype", "fp32", "--max-new-tokens", "24", "--out", str(tmp_path / "out")])
    assert code == 0
    report = json.loads((tmp_path / "out" / "divergence_fp32.json").read_text())
    assert report["data"]["prompts"] == 3 and report["data"]["divergent"] == 0
