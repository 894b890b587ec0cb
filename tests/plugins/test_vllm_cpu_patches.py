"""The fixes of dflash_vllm, each pinned: the CPU ones against a plain reference, against the vLLM line they
answer, registered where vLLM registers its CPU stand-ins and nowhere else; the whole-block one against the
vLLM lines it answers, installed once (its effect on acceptance: test_vllm_serving.py).

The end-to-end proof (vLLM's own server sampling the target's law with the fix, and not without
it) is test_vllm_serving.py; here the broken stand-in is shown broken and the fix shown right on
the same tensors, in vLLM's own environment.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from dflash_vllm.cpu.patches import FIXES, expand_kernel_impl, skip_empty_top_k
from dflash_vllm.drafting import EVIDENCE as WHOLE_BLOCK_EVIDENCE

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
needs_vllm = pytest.mark.skipif(not (ROOT / ".venv-vllm" / ".installed").is_file(),
                                reason="no vLLM environment (.venv-vllm): `make vllm-env` could not build it")


def reference_expand(values: torch.Tensor, cu: torch.Tensor, replace_from, replace_to) -> torch.Tensor:
    """expand_kernel's definition, one request at a time: [a, b] with cu [2, 5] -> [a, a, b, b, b]."""
    out, start = [], 0
    for value, end in zip(values.tolist(), cu.tolist()):
        out += [replace_to if value == replace_from else value] * (end - start)
        start = end
    return torch.tensor(out, dtype=values.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64])
def test_the_fixed_expand_writes_every_token_in_place_in_any_dtype(dtype):
    values = torch.tensor([0.0, 0.7, 1.3, 0.0]).to(dtype) if dtype.is_floating_point else torch.tensor(
        [0, 5, 50, 7], dtype=dtype)
    cu = torch.tensor([2, 5, 6, 9], dtype=torch.int32)
    out = torch.full((9,), -99, dtype=dtype)
    expand_kernel_impl(out, values, cu, 0, 1)
    assert torch.equal(out, reference_expand(values, cu, 0, 1))


def test_top_k_on_an_empty_batch_returns_it_and_defers_otherwise():
    calls = []
    guarded = skip_empty_top_k(lambda logits, k: calls.append(k) or logits * 2)
    empty = torch.empty(0, 8)
    assert guarded(empty, torch.empty(0, dtype=torch.int32)) is empty and calls == []
    assert torch.equal(guarded(torch.ones(1, 8), torch.tensor([3])), torch.full((1, 8), 2.0)) and len(calls) == 1


@needs_vllm
@pytest.mark.parametrize("fix", FIXES, ids=lambda f: f.name)
def test_each_fix_still_meets_the_vllm_code_it_answers(fix):
    module, text = fix.evidence
    site = next((ROOT / ".venv-vllm" / "lib").glob("python3*/site-packages"))
    source = (site / (module.replace(".", "/") + ".py")).read_text()
    assert text in source, (f"fix {fix.name}: vLLM's {module} no longer has {text!r}; re-check whether the fix "
                            "is still needed")
    assert fix.why and len(fix.why.splitlines()) == 1


IN_VLLM = """
import json, torch
from vllm.platforms import current_platform
current_platform.import_kernels()  # vLLM's C++ ops (torch.ops._C), as a worker loads them
from vllm.utils import cpu_triton_utils as cpu_tl
stand_in = cpu_tl._expand_kernel_impl
# the reproduction of docs/vllm-cpu.md: per-request temperatures expanded to per-token, as the rejection sampler does
temperature, cu = torch.tensor([0.7, 1.3]), torch.tensor([2, 5], dtype=torch.int32)
broken = torch.full((5,), -1.0)
stand_in(broken, temperature, cu, 0, 1)

from dflash_vllm.plugin import register
register()  # what vLLM's load_general_plugins() does first in every worker
fixed_impl = cpu_tl._expand_kernel_impl
current_platform.register_triton_kernel_overrides()  # what the worker does next
from vllm.v1.sample import rejection_sampler
fixed = torch.full((5,), -1.0)
rejection_sampler.expand_batch_to_tokens.__globals__["_expand"](fixed, temperature, cu, 0, 1)

from vllm.v1.sample.ops import topk_topp_sampler as tk
empty = tk.apply_top_k_top_p_pytorch(torch.empty(0, 8), torch.empty(0, dtype=torch.int32), None, allow_cpu_sync=True)
print(json.dumps({"broken": broken.tolist(), "fixed": fixed.tolist(), "installed": fixed_impl is not stand_in,
                  "kernel_impl": getattr(rejection_sampler.expand_kernel, "func", None).__module__,
                  "empty_top_k": list(empty.shape)}))
"""

INERT = """
import json, vllm.triton_utils, vllm.triton_utils.importing
import dflash_vllm.cpu.patches as patches
vllm.triton_utils.HAS_TRITON = True  # as where Triton works (a GPU, or triton-cpu): vLLM registers no stand-in
from vllm.utils import cpu_triton_utils as cpu_tl
before = cpu_tl._expand_kernel_impl
print(json.dumps({"installed": patches.register_cpu_fixes(), "same": cpu_tl._expand_kernel_impl is before}))
"""


def _run_in_vllm(script: str) -> dict:
    done = subprocess.run([str(VLLM_PYTHON), "-c", script], capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_vllm
def test_the_stand_in_leaves_temperatures_unwritten_and_the_registered_fix_writes_them():
    seen = _run_in_vllm(IN_VLLM)
    want = [0.7, 0.7, 1.3, 1.3, 1.3]
    assert seen["broken"] == [-1.0] * 5, f"vLLM's stand-in now writes the output ({seen['broken']}): drop the fix?"
    assert seen["installed"] and seen["kernel_impl"] == "dflash_vllm.cpu.patches"
    assert seen["fixed"] == pytest.approx(want)
    assert seen["empty_top_k"] == [0, 8]


EMPTY_TOP_K = """
import torch
from vllm.v1.sample.ops import topk_topp_sampler as tk
tk.apply_top_k_top_p_pytorch(torch.empty(0, 8), torch.empty(0, dtype=torch.int32), None, allow_cpu_sync=True)
"""


@needs_vllm
def test_vllms_own_cpu_top_k_fails_on_an_empty_batch():
    done = subprocess.run([str(VLLM_PYTHON), "-c", EMPTY_TOP_K], capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert done.returncode != 0 and "max(): Expected reduction dim" in done.stderr, "vLLM's top-k works now: drop the fix?"


@needs_vllm
def test_no_fix_is_installed_where_vllm_has_triton():
    seen = _run_in_vllm(INERT)
    assert seen == {"installed": [], "same": True}


SKIPPED = """
import json, os
os.environ["DFLASH_VLLM_SKIP_FIXES"] = "expand-in-place"
from dflash_vllm.cpu.patches import register_cpu_fixes
print(json.dumps(register_cpu_fixes()))
"""


@needs_vllm
def test_a_fix_named_in_the_skip_list_is_left_out():
    assert _run_in_vllm(SKIPPED) == ["top-k-empty-batch"]


# ---- the whole-block fix (dflash_vllm.drafting: every platform) -------------------------------------


@needs_vllm
@pytest.mark.parametrize("evidence", WHOLE_BLOCK_EVIDENCE, ids=lambda e: e[0])
def test_the_whole_block_fix_still_meets_the_vllm_code_it_answers(evidence):
    module, text = evidence
    site = next((ROOT / ".venv-vllm" / "lib").glob("python3*/site-packages"))
    assert text in (site / (module.replace(".", "/") + ".py")).read_text(), (
        f"whole-block: vLLM's {module} no longer has {text!r}; re-check how DFlash lays out its block")


WHOLE_BLOCK = """
import json, os
from dflash_vllm.plugin import register
from vllm.v1.spec_decode.dflash import DFlashProposer
original = DFlashProposer.set_inputs_first_pass
register(); register()  # vLLM may load plugins more than once in a process: wrapped once
wrapped = DFlashProposer.set_inputs_first_pass
os.environ["DFLASH_VLLM_SKIP_FIXES"] = "whole-block"
from dflash_vllm.drafting import register_whole_block
print(json.dumps({"fix": getattr(wrapped, "dflash_vllm_fix", None), "once": wrapped.__closure__[0].cell_contents is original,
                  "skipped": register_whole_block()}))
"""


@needs_vllm
def test_the_whole_block_fix_wraps_vllms_dflash_proposer_once_and_can_be_left_out():
    assert _run_in_vllm(WHOLE_BLOCK) == {"fix": "whole-block", "once": True, "skipped": []}
