"""The tree keeps its shape: the core library imports no CLI, tool or engine; backends meet the protocol."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
import torch
from tiny import drafter_config, tiny_drafter, tiny_target

import dflash_core
from dflash_core import DrafterBackend, DraftState

CORE = Path(dflash_core.__file__).parent
FORBIDDEN = ("dflash_cli", "dflash_bench", "dflash_demo", "dflash_convert", "dflash_sglang", "dflash_trtllm", "dflash_vllm",
             "dflash_serving", "vllm",
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


def _declared_core_dependencies() -> set[str]:
    """Import names of what packages/core/pyproject.toml declares (its optional onnx extra included)."""
    import tomllib

    project = tomllib.loads((CORE.parents[1] / "pyproject.toml").read_text())["project"]
    specs = project["dependencies"] + [s for extra in project["optional-dependencies"].values() for s in extra]
    names = {re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0].strip().lower() for spec in specs}
    return {IMPORT_NAMES.get(n, n.replace("-", "_")) for n in names}


IMPORT_NAMES = {"pyyaml": "yaml"}  # distribution name -> import name, where they differ


def test_the_core_alone_imports_only_what_it_declares():
    """Installing dflash-core alone gives a working library: every import is the standard library, the core
    itself or a declared dependency (the `dflash` command lives in dflash-cli, the tools and engines apart)."""
    allowed = _declared_core_dependencies() | set(sys.stdlib_module_names) | {"dflash_core"}
    assert "torch" in allowed and "dflash_cli" not in allowed
    for module in sorted(CORE.rglob("*.py")):
        stray = _imports(module) - allowed
        assert not stray, f"{module.relative_to(CORE)} imports {sorted(stray)}, which dflash-core does not declare"
    assert not (CORE.parent / "dflash_cli").exists(), "the CLI is its own distribution (packages/cli)"
