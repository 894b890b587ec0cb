"""--to onnx: the drafter graph with KV injection, checked against torch with ONNX Runtime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from dflash_core.dtypes import resolve_dtype
from dflash_core.files.atomic import write_json
from dflash_core.model.onnx_export import GRAPH_FILE, OPSET, DrafterGraph, example_inputs, export_onnx

from ..errors import VerificationFailed
from ..source import drafter_from_source
from ..target_facts import target_lm_head
from . import Job, Result

DEFAULT_DTYPE = "fp32"
FP32_TOLERANCE = 1e-4
# (batch, new context, block, past context): prefill-like, decode-like, odd sizes, empty past
PARITY_SHAPES = [(1, 37, None, 0), (1, 1, None, 64), (3, 5, None, 20), (2, 16, 4, 9), (1, 3, 2, 1)]


def check(job: Job) -> None:
    if job.with_lm_head and job.target is None:
        from dflash_core.errors import CompatibilityError

        raise CompatibilityError("--with-lm-head needs --target-model: the LM head is the target's.")


def plan(job: Job) -> list[str]:
    head = " with the target's LM head (output: logits)" if job.with_lm_head else " (output: hidden_states)"
    return [f"export {GRAPH_FILE}: opset {OPSET}, {job.dtype}{head}, dynamic batch/context/block axes",
            f"check ONNX Runtime against torch at {len(PARITY_SHAPES)} shapes (fp32 must agree within {FP32_TOLERANCE})",
            "write config.json, parity.json"]


def export(job: Job, path: Path) -> torch.Tensor | None:
    """Write the graph; returns the LM head it embeds (or None)."""
    lm_head = target_lm_head(job.target).float() if job.with_lm_head else None
    export_onnx(drafter_from_source(job.source), path, lm_head=lm_head, dtype=resolve_dtype(job.dtype))
    return lm_head


def parity(job: Job, path: Path, lm_head: torch.Tensor | None) -> dict:
    """Max abs difference of every output, ONNX Runtime vs the fp32 torch drafter, over PARITY_SHAPES."""
    import onnxruntime as ort

    reference = DrafterGraph(drafter_from_source(job.source), lm_head).eval()
    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:  # e.g. a bf16 graph on a CPU build without bf16 kernels
        return {"runnable": False, "reason": str(exc).splitlines()[0][:200]}
    dtype = resolve_dtype(job.dtype)
    if dtype == torch.bfloat16:  # numpy has no bfloat16, so ONNX Runtime's Python API cannot feed this graph
        return {"runnable": False, "reason": "ONNX Runtime's Python API takes no bfloat16 inputs (numpy has none)"}
    worst = 0.0
    for seed, (batch, new, block, past) in enumerate(PARITY_SHAPES):
        inputs = example_inputs(reference.drafter, torch.float32, batch, new, block, past, seed)
        with torch.no_grad():
            want = reference(*inputs)
        feeds = {i.name: (x.to(dtype) if x.is_floating_point() else x).numpy()
                 for i, x in zip(session.get_inputs(), inputs)}
        try:
            got = session.run(None, feeds)
        except Exception as exc:
            return {"runnable": False, "reason": str(exc).splitlines()[0][:200]}
        worst = max(worst, max(float(np.abs(g.astype(np.float32) - w.numpy()).max()) for g, w in zip(got, want)))
    return {"runnable": True, "max_abs_diff": worst, "shapes": PARITY_SHAPES}


def build(job: Job, tmp: Path) -> Result:
    graph_path = tmp / GRAPH_FILE
    lm_head = export(job, graph_path)
    report = parity(job, graph_path, lm_head)
    report["dtype"] = job.dtype
    if job.dtype == "fp32" and not (report["runnable"] and report["max_abs_diff"] <= FP32_TOLERANCE):
        raise VerificationFailed(f"ONNX Runtime disagrees with torch: {report}")
    job.source.config.save_pretrained(tmp)
    write_json(tmp / "parity.json", report)
    figure = (f"max abs diff vs torch fp32 {report['max_abs_diff']:.2e}" if report["runnable"]
              else f"not runnable on ONNX Runtime CPU ({report['reason']})")
    return Result([f"{GRAPH_FILE}: {job.dtype}, {figure}"], None, {"parity": report})
