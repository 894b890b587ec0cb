"""A stand-in for `sgl_kernel` on a CPU without its CPU build: pure-torch versions of the ops SGLang calls.

Put on PYTHONPATH of the SGLang server (and its spawned children) only for `--device cpu`, by
`dflash_sglang.serve`. Why: SGLang 0.5.23 imports `sgl_kernel`'s CPU ops at import time whenever it
runs on the CPU (`srt/mem_cache/allocation.py`: `from sgl_kernel import assign_req_to_token_pool_cpu`),
but the PyPI `sglang-kernel` wheel holds only CUDA builds (it cannot even be imported without
libcuda), and its CPU build is a source build that assumes AVX-512.

Three groups of names:
- ops SGLang calls on the CPU when serving DFLASH: real implementations, same signatures and
  in-place semantics as the C++ ops they stand in for;
- ops SGLang imports at module level on the CPU but calls only for other algorithms (EAGLE trees,
  multi-layer EAGLE): present so that the import succeeds, raising NotImplementedError if called;
- everything else raises ImportError/AttributeError, so SGLang's own `try: from sgl_kernel import ...
  except ImportError` fallbacks take their torch path.
"""

from __future__ import annotations

import ctypes

import torch

__version__ = "0.0.0+dflash-cpu-stand-in"
STAND_IN = True  # lets a test (or a person) tell this package from the real sgl_kernel


def _spans(start_offset: torch.Tensor, end_offset: torch.Tensor) -> tuple[list[int], list[int]]:
    return start_offset.tolist(), end_offset.tolist()


def assign_req_to_token_pool_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """req_to_token[req_pool_indices[i], start[i]:end[i]] = the next end[i]-start[i] entries of out_cache_loc.

    req_to_token: [pool rows, pool_len] int32; out_cache_loc: [sum(end - start)] (requests in order).
    """
    taken = 0
    for row, start, end in zip(req_pool_indices.tolist(), *_spans(start_offset, end_offset)):
        req_to_token[row, start:end] = out_cache_loc[taken:taken + end - start].to(req_to_token.dtype)
        taken += end - start


def assign_extend_cache_locs_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """The reverse gather: out_cache_loc (packed, requests in order) = req_to_token[row, start:end] per request."""
    taken = 0
    for row, start, end in zip(req_pool_indices.tolist(), *_spans(start_offset, end_offset)):
        out_cache_loc[taken:taken + end - start] = req_to_token[row, start:end].to(out_cache_loc.dtype)
        taken += end - start


def copy_all_layer_kv_cache_cpu(data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor,
                                src_loc: torch.Tensor) -> None:
    """For every KV buffer (given by address and row size in bytes): row tgt_loc[j] = row src_loc[j].

    The buffers are SGLang's own contiguous CPU KV tensors ([slots, heads, head_dim] each); the op
    receives only their addresses, so each is viewed as bytes up to the highest row touched.
    Sources are read before any target is written, as a gather then a scatter.
    """
    if tgt_loc.numel() == 0:
        return
    tgt, src = tgt_loc.long(), src_loc.long()
    rows = int(torch.maximum(tgt.max(), src.max()).item()) + 1
    for address, stride in zip(data_ptrs.tolist(), strides.tolist()):
        raw = (ctypes.c_uint8 * (rows * stride)).from_address(int(address))
        view = torch.frombuffer(raw, dtype=torch.uint8).view(rows, stride)
        view[tgt] = view[src].clone()


def _not_on_cpu(name: str):
    def op(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name} is not provided by the DFlash CPU stand-in "
                                  "(it serves DFLASH only; this op belongs to another algorithm).")

    op.__name__ = name
    return op


# imported at module level by SGLang on the CPU (kernels/ops/speculative/*.py), called only by EAGLE paths
for _name in ("assign_draft_cache_locs_contiguous_cpu", "rotate_input_ids_cpu", "fill_accept_out_cache_loc_cpu",
              "fill_bonus_tokens_cpu", "build_tree_kernel_efficient_cpu", "verify_tree_greedy_cpu"):
    globals()[_name] = _not_on_cpu(_name)
del _name
