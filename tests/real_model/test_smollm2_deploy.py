"""Every deployment target on the real pair: `dflash-convert --to sglang|trtllm|onnx --target-model` SmolLM2,
and SGLang's own DFlashDraftModel loading the converted drafter and agreeing with dflash_core.

SmolLM2's embedding has no spare row for a new `<|MASK|>` (49,152 tokens, 49,152 rows), so its drafter
uses the reserved token `<empty_output>` as the mask: the converters must pass that id through and
leave the target's tokenizer as it is (no tokenizer/ written beside the drafter).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from smollm2 import MASK_TOKEN, ROOT, real_drafter, require_target

SGLANG_PYTHON = ROOT / ".venv-sglang" / "bin" / "python"
HARNESS = ROOT / "tests" / "plugins" / "sglang_numerics.py"


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory) -> Path:
    from dflash_core.loading import load_target, load_tokenizer

    path = require_target()
    target, tokenizer = load_target(path, (), "fp32"), load_tokenizer(path)
    out = tmp_path_factory.mktemp("smollm2") / "drafter"
    real_drafter(target, tokenizer).save_pretrained(out, dtype="fp32")
    return out


@pytest.mark.parametrize("to", ["sglang", "trtllm", "onnx"])
def test_converts_for_the_real_target(drafter_dir, tmp_path, to, capsys):
    from dflash_convert.cli import main as convert
    from dflash_core.loading import load_tokenizer

    out = tmp_path / to
    assert convert([str(drafter_dir), "--to", to, "--target-model", str(require_target()), "--out", str(out)]) == 0
    note = capsys.readouterr().err
    mask_id = load_tokenizer(require_target()).convert_tokens_to_ids(MASK_TOKEN)
    assert f"mask_token_id {mask_id} is the existing token '{MASK_TOKEN}'" in note
    assert not (out / "tokenizer").exists()  # nothing was added: the target's tokenizer serves as is
    config = json.loads((out / "config.json").read_text())
    assert config["dflash_config"]["mask_token_id"] == mask_id
    if to == "trtllm":
        assert f"mask_token_id: {mask_id}" in (out / "dflash.yaml").read_text()
    if to == "onnx":  # the exported graph agrees with the torch drafter on SmolLM2's shapes
        parity = json.loads((out / "parity.json").read_text())
        assert parity["runnable"] and parity["max_abs_diff"] < 1e-4, parity


@pytest.mark.skipif(not (ROOT / ".venv-sglang" / ".installed").is_file(),
                    reason="no SGLang environment (.venv-sglang): `make sglang-env` could not build it")
def test_sglang_loads_the_converted_smollm2_drafter_and_agrees(drafter_dir, tmp_path):
    from dflash_convert.cli import main as convert

    out = tmp_path / "sgl"
    assert convert([str(drafter_dir), "--to", "sglang", "--target-model", str(require_target()), "--out", str(out),
                    "--dtype", "fp32"]) == 0
    done = subprocess.run([str(SGLANG_PYTHON), str(HARNESS), str(out)], capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0 and "SGLANG CHECK OK" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    assert "all 11 parameters written" in done.stdout  # one layer: 8 parameters, plus fc, hidden_norm and norm
