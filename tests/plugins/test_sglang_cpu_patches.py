"""The CPU runtime of dflash_sglang, part by part: the stand-in sgl_kernel ops, the patches against SGLang's code.

The end-to-end proof (SGLang's own server serving DFLASH with them) is test_sglang_serving.py; here
each piece is pinned: an op against a plain reference, each patch against the SGLang source line it
works around (so an SGLang that fixes one shows up as a failing test, not a silent extra patch), and
registration only on SGLang's CPU engine (a GPU launch gets none of them).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest
import torch

from dflash_sglang import targets
from dflash_sglang.cpu import STAND_IN_DIR
from dflash_sglang.cpu.patches import PATCHES

ROOT = Path(__file__).resolve().parents[2]
SGLANG_PYTHON = ROOT / ".venv-sglang" / "bin" / "python"
needs_sglang = pytest.mark.skipif(not (ROOT / ".venv-sglang" / ".installed").is_file(),
                                  reason="no SGLang environment (.venv-sglang): `make sglang-env` could not build it")


def stand_in():
    spec = importlib.util.spec_from_file_location("sgl_kernel_stand_in", STAND_IN_DIR / "sgl_kernel" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_req_to_token_assignment_and_its_reverse_gather():
    ops = stand_in()
    req_to_token = torch.zeros(4, 10, dtype=torch.int32)
    rows, start, end = torch.tensor([2, 0]), torch.tensor([3, 0]), torch.tensor([6, 2])
    locs = torch.tensor([11, 12, 13, 21, 22], dtype=torch.int64)  # request 2 gets 3 slots, request 0 gets 2
    ops.assign_req_to_token_pool_cpu(rows, req_to_token, start, end, locs, 10)
    assert req_to_token[2, 3:6].tolist() == [11, 12, 13] and req_to_token[0, :2].tolist() == [21, 22]
    assert int(req_to_token.count_nonzero()) == 5
    out = torch.empty(5, dtype=torch.int64)
    ops.assign_extend_cache_locs_cpu(rows, req_to_token, start, end, out, 10)
    assert out.tolist() == locs.tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_rows_are_copied_in_every_buffer_gather_then_scatter(dtype):
    ops = stand_in()
    buffers = [torch.randn(16, 2, 8).to(dtype) for _ in range(3)]  # [slots, kv heads, head dim], as SGLang's pool
    before = [b.clone() for b in buffers]
    ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in buffers])
    tgt, src = torch.tensor([5, 3, 9]), torch.tensor([3, 7, 5])  # 3 is both read and written: read first
    ops.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    for b, old in zip(buffers, before):
        want = old.clone()
        want[tgt] = old[src]
        assert torch.equal(b, want)


def test_names_the_stand_in_lacks_are_import_errors_and_eagle_ops_refuse_to_run():
    ops = stand_in()
    assert not hasattr(ops, "silu_and_mul")  # so `from sgl_kernel import silu_and_mul` raises ImportError
    with pytest.raises(NotImplementedError, match="serves DFLASH only"):
        ops.verify_tree_greedy_cpu()


def _sglang_source(module: str) -> str:
    site = next((ROOT / ".venv-sglang" / "lib").glob("python3*/site-packages"))
    return (site / (module.replace(".", "/") + ".py")).read_text()


@needs_sglang
@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_each_patch_still_meets_the_sglang_code_it_works_around(patch):
    module, text = patch.evidence
    assert text in _sglang_source(module), (
        f"patch {patch.name}: SGLang's {module} no longer has {text!r}; re-check whether the patch is still needed")
    assert patch.why and len(patch.why.splitlines()) == 1


REGISTRATION = """
import json, os
from sglang.srt.plugins.hook_registry import HookRegistry
from dflash_sglang.plugin import register
register()  # as on a GPU: no CPU engine
plain = sorted(HookRegistry._hooks)
HookRegistry.reset()
os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
register()
cpu = sorted(HookRegistry._hooks)
HookRegistry.apply_hooks()  # resolves every target in SGLang's real modules and wraps it
from sglang.srt.arg_groups.choices import DRAFT_ATTENTION_BACKEND_CHOICES
print(json.dumps({"plain": plain, "cpu": cpu, "patched": sorted(HookRegistry._patched),
                  "torch_native": "torch_native" in DRAFT_ATTENTION_BACKEND_CHOICES}))
"""


@needs_sglang
def test_patches_are_registered_and_applied_on_the_cpu_engine_only():
    done = subprocess.run([str(SGLANG_PYTHON), "-c", REGISTRATION], capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(STAND_IN_DIR), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    preflight = "sglang.srt.arg_groups.speculative_hook._handle_dflash"
    # without the CPU engine: the draft-directory check and the Qwen2 capture hook (dflash_sglang.targets)
    assert seen["plain"] == sorted([preflight, targets.HOOK_TARGET])
    assert set(seen["cpu"]) == {preflight, targets.HOOK_TARGET} | {p.target for p in PATCHES}
    assert set(seen["patched"]) == set(seen["cpu"]), "a patch target did not resolve in SGLang"
    assert seen["torch_native"]
