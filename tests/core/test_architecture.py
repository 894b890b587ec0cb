"""The tree keeps its shape: the core library imports no CLI, tool or engine; backends meet the protocol."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from tiny import drafter_config, tiny_drafter, tiny_target

import dflash_core
from dflash_core import DrafterBackend, DraftState

CORE = Path(dflash_core.__file__).parent
FORBIDDEN = ("dflash_cli", "dflash_bench", "dflash_demo", "dflash_convert", "dflash_sglang", "dflash_trtllm",
             "sglang", "tensorrt", "tensorrt_llm", "matplotlib", "yaml", "argparse")


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("module", sorted(CORE.rglob("*.py")), ids=lambda p: str(p.relative_to(CORE)))
def test_core_module_imports_no_cli_tool_or_engine(module):
    bad = _imports(module) & set(FORBIDDEN)
    assert not bad, f"{module.relative_to(CORE)} imports {sorted(bad)}"


def test_both_drafter_backends_implement_the_protocol(tmp_path):
    from dflash_core.model.onnx_export import export_onnx
    from dflash_core.model.ort_drafter import load_onnx_drafter

    model = tiny_target()
    drafter = tiny_drafter(drafter_config(model, block_size=4))
    export_onnx(drafter, tmp_path / "drafter.onnx", dtype=torch.float32)
    for backend in (drafter, load_onnx_drafter(tmp_path / "drafter.onnx")):
        assert isinstance(backend, DrafterBackend)
        assert isinstance(backend.new_cache(2, 16), DraftState)
