"""The core's folders are layers: a module imports only its own layer and the ones below, never in a circle.

Layers, bottom up (each package's `__init__` docstring says the same):
  base      errors, dtypes, devices, files/       what everything may use
  kernels/  fast exact products                   base
  sampling/ tokens from logits, acceptance math   base
  model/    the drafter and its runtimes          + kernels, sampling
  target/   the Hugging Face target adapter       + model
  tuning/   what measures this machine            + target
  decode/   the reference loop and draft sources  + tuning
  loading, training/, the package's __init__      anything below
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dflash_core

CORE = Path(dflash_core.__file__).parent
RANK = {"errors": 0, "dtypes": 0, "devices": 0, "files": 0, "kernels": 1, "sampling": 1, "model": 2, "target": 3,
        "tuning": 4, "decode": 5, "loading": 6, "training": 7, "__init__": 8}


def _module_name(path: Path) -> str:
    parts = path.relative_to(CORE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _core_imports(path: Path) -> list[tuple[str, bool]]:
    """(dflash_core module imported, whether the import is at module level) for every import in `path`."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path.relative_to(CORE)}: relative import; the core imports by full name")
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dflash_core"):
            for alias in node.names:  # `from dflash_core.model import graph` imports the module graph
                sub = f"{node.module}.{alias.name}"
                name = sub if (CORE.parent / (sub.replace(".", "/") + ".py")).exists() else node.module
                found.append((name, id(node) in top))
        elif isinstance(node, ast.Import):
            found += [(a.name, id(node) in top) for a in node.names if a.name.startswith("dflash_core")]
    return found


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


MODULES = {_module_name(p): p for p in CORE.rglob("*.py")}


def test_every_core_module_sits_in_a_known_layer():
    assert {_layer(m) for m in MODULES} <= set(RANK), sorted({_layer(m) for m in MODULES} - set(RANK))


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_and_none_hides_in_a_function(module):
    for imported, at_top in _core_imports(MODULES[module]):
        assert at_top, f"{module} imports {imported} inside a function"
        mine, theirs = _layer(module), _layer(imported)
        if imported == "dflash_core" or (imported.count(".") == 1 and (CORE / imported.split(".")[1]).is_dir()):
            assert mine == theirs or module == "dflash_core", f"{module} imports the package {imported}"
            continue
        ok = RANK[theirs] < RANK[mine] or mine == theirs or RANK[mine] == RANK[theirs] == 0  # base: one layer
        assert ok, f"{module} ({mine}, layer {RANK[mine]}) imports {imported} ({theirs}, layer {RANK[theirs]})"


def test_no_import_circle():
    graph = {m: {i for i, _ in _core_imports(p) if i in MODULES and i != m} for m, p in MODULES.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_the_layering_check_sees_a_violation(tmp_path):
    """The checker itself: an import upward (model -> tuning) and one hidden in a function are both seen."""
    bad = tmp_path / "bad.py"
    bad.write_text("from dflash_core.tuning.cost_table import X\ndef f():\n    from dflash_core.model import graph\n")
    found = _core_imports(bad)
    assert ("dflash_core.tuning.cost_table", True) in found and ("dflash_core.model.graph", False) in found
    assert RANK[_layer("dflash_core.tuning.cost_table")] > RANK[_layer("dflash_core.model.drafter")]


def _empty_container(node: ast.expr) -> bool:
    """`{}`, `[]`, `set()`, `dict()`, `WeakKeyDictionary()` and the like: a module-level one is a cache to fill."""
    if isinstance(node, (ast.Dict, ast.List, ast.Set)):
        return not (getattr(node, "keys", None) or getattr(node, "elts", None))
    if isinstance(node, ast.Call) and not node.args and not node.keywords:
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        return name in {"dict", "list", "set", "defaultdict", "OrderedDict", "WeakKeyDictionary", "WeakValueDictionary"}
    return False


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_process_wide_cache_to_fill(module):
    """State lives in objects the caller holds (`Tuning`, `MatmulLayouts`, a drafter): no module starts an empty
    container that calls then fill."""
    tree = ast.parse(MODULES[module].read_text())
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        assert value is None or not _empty_container(value), f"{module} line {node.lineno}: a module-level cache"


def test_the_cache_check_sees_one():
    for source in ("_SEEN = {}", "_SEEN: dict = {}", "_H = weakref.WeakKeyDictionary()", "CACHE = dict()"):
        assert _empty_container(ast.parse(source).body[0].value), source
    assert not _empty_container(ast.parse("TABLE = {'a': 1}").body[0].value)
