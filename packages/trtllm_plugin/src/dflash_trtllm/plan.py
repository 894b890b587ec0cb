"""A TensorRT plan of the drafter graph, built from its ONNX export with TensorRT's Python API.

TensorRT is imported lazily; `missing_requirements()` says, in one line, what this machine lacks
(the package, or a CUDA GPU) before anything is built or written.
"""

from __future__ import annotations

import ctypes
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from dflash_core.model.config import DFlashConfig


@dataclass(frozen=True)
class ShapeLimits:
    """Ranges the plan must serve (one optimisation profile: min / opt / max)."""

    max_batch: int = 8
    max_context: int = 4096
    """Longest cached context (past) the drafter attends to."""
    max_new_context: int = 2048
    """Most context tokens appended in one call (the prompt, at prefill)."""
    opt_context: int = 512


def cuda_device_count() -> int:
    """CUDA devices visible through the driver API (0 when there is no driver)."""
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        return 0
    if lib.cuInit(0) != 0:
        return 0
    count = ctypes.c_int(0)
    return count.value if lib.cuDeviceGetCount(ctypes.byref(count)) == 0 else 0


def missing_requirements() -> str | None:
    """None when a plan can be built here, else one line naming what is missing."""
    if importlib.util.find_spec("tensorrt") is None:
        return ("the Python package 'tensorrt' is not installed (it needs an NVIDIA GPU machine: "
                "pip install tensorrt there)")
    if cuda_device_count() == 0:
        return "no CUDA GPU is visible (TensorRT builds plans on an NVIDIA GPU)"
    return None


def profile_shapes(config: DFlashConfig, limits: ShapeLimits) -> dict[str, tuple[tuple[int, ...], ...]]:
    """min/opt/max shape of every graph input, consistent across inputs (see onnx_export's signature)."""
    c, q = config, config.block_size
    kv = (c.num_hidden_layers, c.num_key_value_heads, c.head_dim)
    batch = (1, 1, limits.max_batch)
    new = (1, q, limits.max_new_context)
    past = (0, limits.opt_context, limits.max_context)
    block = (2, q, q)
    shapes = {
        "noise_embedding": [(b, blk, c.hidden_size) for b, blk in zip(batch, block)],
        "target_hidden": [(b, n, c.fc_in_features) for b, n in zip(batch, new)],
        "position_ids": [(b, n + blk) for b, n, blk in zip(batch, new, block)],
        "past_key": [(kv[0], b, kv[1], p, kv[2]) for b, p in zip(batch, past)],
        "past_value": [(kv[0], b, kv[1], p, kv[2]) for b, p in zip(batch, past)],
        "context_valid": [(b, p + n) for b, p, n in zip(batch, past, new)],
    }
    return {name: tuple(dims) for name, dims in shapes.items()}


def build_plan(onnx_path: str | Path, plan_path: str | Path, config: DFlashConfig, precision: str,
               limits: ShapeLimits = ShapeLimits(), workspace_bytes: int = 4 << 30) -> Path:
    """Parse the ONNX graph, set precision and the profile, and serialise the engine to `plan_path`."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT could not parse {onnx_path}: {errors}")
    build = builder.create_builder_config()
    build.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    # TensorRT 10 takes precision flags; TensorRT 11 builds at the ONNX graph's own types
    flag = {"fp16": "FP16", "bf16": "BF16"}.get(precision)
    if flag and hasattr(trt.BuilderFlag, flag):
        build.set_flag(getattr(trt.BuilderFlag, flag))
    profile = builder.create_optimization_profile()
    for name, (low, opt, high) in profile_shapes(config, limits).items():
        profile.set_shape(name, low, opt, high)
    if build.add_optimization_profile(profile) < 0:
        raise RuntimeError("TensorRT rejected the optimisation profile")
    plan = builder.build_serialized_network(network, build)
    if plan is None:
        raise RuntimeError("TensorRT failed to build the plan (see its log above)")
    Path(plan_path).write_bytes(bytes(plan))
    return Path(plan_path)
