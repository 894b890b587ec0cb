"""Converted drafters load as is into the real SGLang 0.5.23 (its own DFlashDraftModel, on CPU).

Runs the test harness `sglang_numerics.py` (beside this file) inside `.venv-sglang` (made by
`make sglang-env`, which `make test` attempts); skipped with the reason when that environment
could not be built.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from tiny import drafter_config, tiny_drafter

from dflash_convert.cli import main as convert

ROOT = Path(__file__).resolve().parents[2]
SGLANG_PYTHON = ROOT / ".venv-sglang" / "bin" / "python"
HARNESS = Path(__file__).with_name("sglang_numerics.py")
pytestmark = pytest.mark.skipif(not (ROOT / ".venv-sglang" / ".installed").is_file(),
                                reason="no SGLang environment (.venv-sglang): `make sglang-env` could not build it")


def _check(draft: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(SGLANG_PYTHON), str(HARNESS), str(draft)], capture_output=True,
                          text=True, timeout=600, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize("heads,kv_heads,layers", [(4, 2, 2), (4, 4, 1), (8, 2, 3)])
def test_converted_drafter_loads_into_sglang_and_agrees(tmp_path, heads, kv_heads, layers):
    config = drafter_config(hidden=64, heads=heads, kv_heads=kv_heads, target_layers=12, layers=layers,
                            block_size=8, layer_ids=tuple(range(2, 2 + 3 * layers, 3)), vocab=128)
    tiny_drafter(config, seed=layers).save_pretrained(tmp_path / "src")
    assert convert([str(tmp_path / "src"), "--to", "sglang", "--out", str(tmp_path / "sgl"), "--dtype", "fp32"]) == 0
    done = _check(tmp_path / "sgl")
    assert done.returncode == 0 and "SGLANG CHECK OK" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    # SGLang fuses q/k/v and gate/up: 8 parameters per layer, plus fc, hidden_norm and norm
    assert f"all {8 * layers + 3} parameters written" in done.stdout


def test_the_check_fails_on_a_drafter_sglang_would_load_silently(tmp_path):
    """SGLang's load_weights ignores a missing tensor; the check must not."""
    from safetensors.torch import load_file, save_file

    config = drafter_config(hidden=64, heads=4, kv_heads=2, target_layers=12, layers=1, block_size=8,
                            layer_ids=(3,), vocab=128)
    tiny_drafter(config).save_pretrained(tmp_path / "src")
    assert convert([str(tmp_path / "src"), "--to", "sglang", "--out", str(tmp_path / "sgl"), "--dtype", "fp32"]) == 0
    weights = tmp_path / "sgl" / "model.safetensors"
    tensors = load_file(str(weights))
    tensors.pop("layers.0.mlp.up_proj.weight")
    save_file(tensors, str(weights))
    done = _check(tmp_path / "sgl")
    assert done.returncode == 1 and "SGLANG CHECK FAILED" in done.stdout
    assert "not written by load_weights" in done.stdout + done.stderr


PROBE = """
import os, sys
os.environ["SGLANG_PLUGINS"] = "dflash"
from sglang.srt.plugins import load_plugins
load_plugins()  # what launch_server does first: our entry point registers its hook
from sglang.srt.server_args import ServerArgs
args = ServerArgs(model_path=sys.argv[2], speculative_algorithm="DFLASH", speculative_draft_model_path=sys.argv[1],
                  device="cpu", speculative_num_draft_tokens=int(sys.argv[3]))
try:
    args.resolve_once()  # SGLang's argument pipeline, which calls _handle_dflash
except Exception as exc:
    print("RAISED", type(exc).__name__, exc)
"""


def test_plugin_hook_checks_the_draft_before_sglang_starts_dflash(tmp_path):
    from tiny import tiny_target

    tiny_target(vocab=128, hidden=64, layers=8).save_pretrained(tmp_path / "target")
    config = drafter_config(hidden=64, heads=4, target_layers=8, layers=1, block_size=8, layer_ids=(3,), vocab=128)
    tiny_drafter(config).save_pretrained(tmp_path / "src")
    assert convert([str(tmp_path / "src"), "--to", "sglang", "--out", str(tmp_path / "sgl")]) == 0

    def probe(tokens: int) -> str:
        done = subprocess.run([str(SGLANG_PYTHON), "-c", PROBE, str(tmp_path / "sgl"), str(tmp_path / "target"),
                               str(tokens)], capture_output=True, text=True, timeout=600,
                              env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
        return done.stdout + done.stderr

    intact = probe(8)  # our check passes, then SGLang's own check refuses the CPU device
    assert "RAISED ValueError DFLASH speculative decoding is not supported" in intact
    assert "dflash-sglang" not in intact.split("RAISED")[-1]
    assert "trained with blocks of 8" in probe(16)  # a warning, then SGLang continues to its own check
    weights = tmp_path / "sgl" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    damaged = probe(8)
    assert "RAISED CheckpointError draft directory" in damaged and "changed since dflash-convert wrote it" in damaged
