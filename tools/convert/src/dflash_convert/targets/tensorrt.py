"""--to tensorrt: a TensorRT plan of the drafter graph (needs the tensorrt package and an NVIDIA GPU)."""

from __future__ import annotations

from pathlib import Path

from dflash_core.files.atomic import write_json
from dflash_trtllm.plan import ShapeLimits, build_plan, missing_requirements, profile_shapes

from ..errors import MissingRequirement
from . import Job, Result
from . import onnx as onnx_target

DEFAULT_DTYPE = "fp16"
PLAN_FILE = "drafter.plan"


def check(job: Job) -> None:
    missing = missing_requirements()
    if missing:
        raise MissingRequirement(f"cannot build a TensorRT plan here: {missing}.")
    onnx_target.check(job)


def plan(job: Job) -> list[str]:
    shapes = profile_shapes(job.source.config, ShapeLimits())
    return [f"export {onnx_target.GRAPH_FILE} ({job.dtype}) as for --to onnx",
            f"build {PLAN_FILE} with TensorRT: precision {job.dtype}, one profile over batch/context/block "
            f"(noise_embedding min/opt/max {shapes['noise_embedding']})",
            "write config.json, profile.json"]


def build(job: Job, tmp: Path) -> Result:
    graph_path = tmp / onnx_target.GRAPH_FILE
    onnx_target.export(job, graph_path)
    limits = ShapeLimits()
    build_plan(graph_path, tmp / PLAN_FILE, job.source.config, job.dtype, limits)
    job.source.config.save_pretrained(tmp)
    write_json(tmp / "profile.json", {k: [list(s) for s in v] for k, v in profile_shapes(job.source.config, limits).items()})
    return Result([f"{PLAN_FILE}: TensorRT plan ({job.dtype})"], None)
