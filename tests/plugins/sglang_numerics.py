"""Test harness: load a converted drafter into SGLang's own DFlashDraftModel (on CPU), compare with dflash_core.

    .venv-sglang/bin/python tests/plugins/sglang_numerics.py DRAFT_DIR      (run by test_sglang_native.py)

A test harness, not library code: it sets SGLang's module flags and process-wide parallel state
for one process, which no library should do.

Runs in the SGLang environment (sglang 0.5.23 installed). Checks, with SGLang's own code paths:
the config through `ModelConfig(is_draft_model=True)` and the architecture registry; weights through
`safetensors_weights_iterator` + `load_weights` (every parameter written, fused q/k/v and gate/up
equal to the checkpoint); `parse_dflash_draft_config`; and numerics: `project_target_hidden`, the
worker's context-K/V path, MLP and norms, and the full draft forward through RadixAttention with the
torch-native backend, each within 1e-4 of dflash_core, plus negative controls. No network, no GPU.
Exit status 1 and "SGLANG CHECK FAILED" on any mismatch.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F

TOL = 1e-4
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, f"shape mismatch {tuple(a.shape)} vs {tuple(b.shape)}"
    return (a.double() - b.double()).abs().max().item()


RESULTS: list[tuple[str, float]] = []


def check(name: str, ours: torch.Tensor, theirs: torch.Tensor, tol: float = TOL) -> None:
    d = maxdiff(ours, theirs)
    RESULTS.append((name, d))
    print(f"    {name:<48s} max|diff| = {d:.3e}", flush=True)
    if not d <= tol:  # also catches NaN
        raise AssertionError(f"{name}: max abs diff {d} > {tol}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(draft_dir: str) -> None:
    draft_dir = os.path.abspath(draft_dir)

    # ---- 0. CPU setup ----------------------------------------------------------------------
    # RotaryEmbedding.__init__ picks a compiled rotary kernel unless the module-level _is_cpu
    # flag is set; off CUDA that is `vllm._custom_ops` (not installed). SGLang's own CPU mode
    # (SGLANG_USE_CPU_ENGINE=1) would set it, but that mode also imports sgl_kernel's CPU ops,
    # which the CUDA wheel lacks. So set only this one flag: the rotary then uses forward_native.
    import sglang.srt.layers.rotary_embedding.base as rope_base

    rope_base._is_cpu = True

    from sglang.srt.runtime_context import get_parallel

    get_parallel().override_permanently(
        tp_size=1, pp_size=1, moe_ep_size=1, moe_dp_size=1, moe_tp_size=1, attn_dp_size=1,
        attn_cp_size=1, attn_tp_size=1, attn_dcp_size=1, shared_experts_tp_size=None,
    )
    from sglang.srt.distributed.parallel_state import (
        destroy_distributed_environment,
        destroy_model_parallel,
        init_distributed_environment,
        initialize_model_parallel,
    )

    port = free_port()
    init_distributed_environment(backend="gloo", world_size=1, rank=0, local_rank=0,
                                 distributed_init_method=f"tcp://127.0.0.1:{port}")
    try:
        initialize_model_parallel()
        log(f"gloo process group up (port {port}), tensor-parallel size {get_parallel().tp_size}")
        run_checks(draft_dir)
    finally:
        destroy_model_parallel()
        destroy_distributed_environment()


def run_checks(draft_dir: str) -> None:
    import dflash_core

    model, cfg = load_into_sglang(draft_dir)
    ours = dflash_core.load_drafter(draft_dir, dtype="fp32")
    check_config(model, cfg, ours)
    check_numerics(model, ours)
    worst = max(d for _, d in RESULTS)
    log(f"{len(RESULTS)} numeric comparisons, worst max|diff| = {worst:.3e} (tolerance {TOL:g})")


def load_into_sglang(draft_dir: str):
    """SGLang's config, architecture resolution and weight loading, with every parameter accounted for."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.utils import get_model_architecture, set_default_torch_dtype
    from sglang.srt.models.dflash import DFlashDraftModel

    # ---- 1. config and model, the way SGLang's draft worker gets them ---------------------
    mc = ModelConfig(draft_dir, trust_remote_code=False, is_draft_model=True, dtype="float32",
                     speculative_algorithm="DFLASH")
    cfg = mc.hf_config
    log(f"ModelConfig(is_draft_model=True): {type(cfg).__name__}, model_type={cfg.model_type}, "
        f"architectures={cfg.architectures}, dtype={mc.dtype}")
    auto_dtype = ModelConfig(draft_dir, trust_remote_code=False, is_draft_model=True,
                             speculative_algorithm="DFLASH").dtype
    log(f"  (with --dtype auto SGLang would run this draft in {auto_dtype})")
    model_cls, arch = get_model_architecture(mc)
    log(f"registry resolves architecture {arch!r} -> {model_cls.__module__}.{model_cls.__name__}")
    assert model_cls is DFlashDraftModel, f"resolved {model_cls}, expected DFlashDraftModel"

    with set_default_torch_dtype(torch.float32), torch.device("cpu"):
        model = model_cls(config=cfg, quant_config=None)
    model.eval()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for p in params.values():
            p.fill_(float("nan"))

    # the weight files SGLang's DefaultModelLoader._prepare_weights picks with --load-format auto
    # (top-level *.safetensors, filtered by model.safetensors.index.json when present). That method
    # itself needs published server args, so its two steps are repeated here with SGLang's helper.
    import glob

    from sglang.srt.model_loader.weight_utils import filter_duplicate_safetensors_files

    files = sorted(filter_duplicate_safetensors_files(
        glob.glob(os.path.join(draft_dir, "*.safetensors")), draft_dir, "model.safetensors.index.json"))
    assert files, f"no *.safetensors weights in {draft_dir}"
    log(f"weight files SGLang would load: {[os.path.basename(f) for f in files]}")
    _load_weights(model, files, params)
    return model, cfg


def _load_weights(model, files, params) -> None:
    import safetensors.torch
    from sglang.srt.model_loader.loader import DefaultModelLoader
    from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator

    ckpt: dict[str, torch.Tensor] = {}  # the reference copy, read independently of SGLang
    for f in files:
        ckpt.update(safetensors.torch.load_file(f))
    seen: list[str] = []

    def weights():
        for name, tensor in safetensors_weights_iterator(files):
            seen.append(name)
            yield name, tensor

    DefaultModelLoader.load_weights_and_postprocess(model, weights(), torch.device("cpu"))
    assert sorted(seen) == sorted(ckpt), "SGLang's iterator yielded other tensors than the files hold"
    not_loaded = [n for n, p in params.items() if torch.isnan(p).any()]
    assert not not_loaded, f"parameters not written by load_weights: {not_loaded}"
    n_param = sum(p.numel() for p in params.values())
    n_ckpt = sum(t.numel() for t in ckpt.values())
    assert n_param == n_ckpt, f"checkpoint has {n_ckpt} values, model {n_param}: some tensors were dropped"
    # every fused parameter is exactly the concatenation of the checkpoint tensors
    ref = {k.removeprefix("model."): v for k, v in ckpt.items()}  # load_weights accepts both spellings
    exact = 0
    for name, p in params.items():
        if name in ref:  # a plain or an already-fused tensor
            src = ref[name]
        elif ".qkv_proj." in name:
            src = torch.cat([ref[name.replace("qkv_proj", x)] for x in ("q_proj", "k_proj", "v_proj")])
        elif ".gate_up_proj." in name:
            src = torch.cat([ref[name.replace("gate_up_proj", x)] for x in ("gate_proj", "up_proj")])
        else:
            raise AssertionError(f"{name}: no checkpoint tensor to compare with")
        assert torch.equal(p.data, src.to(p.dtype)), f"{name} differs from the checkpoint"
        exact += 1
    log(f"load_weights: {len(ckpt)} checkpoint tensors -> all {len(params)} parameters written "
        f"({n_param} values, none left NaN; {exact} equal the checkpoint bit for bit)")
    for name, p in params.items():
        print(f"    {name:<48s} {tuple(p.shape)} {p.dtype}")


def check_config(model, cfg, ours) -> None:
    """SGLang's parsing of our dflash_config agrees with ours."""
    from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config

    oc = ours.config
    dc = parse_dflash_draft_config(draft_hf_config=cfg)
    ids = dc.resolve_target_layer_ids(target_num_layers=oc.num_target_layers,
                                      draft_num_layers=oc.num_hidden_layers)
    log(f"parse_dflash_draft_config: block_size={dc.block_size} target_layer_ids={dc.target_layer_ids} "
        f"mask_token_id={dc.mask_token_id} num_target_layers={dc.num_target_layers} "
        f"(ours: {oc.block_size}, {list(oc.target_layer_ids)}, {oc.mask_token_id}, {oc.num_target_layers})")
    assert dc.block_size == oc.block_size
    assert model.block_size == oc.block_size
    assert list(dc.target_layer_ids) == list(oc.target_layer_ids) == list(ids)
    assert dc.mask_token_id == oc.mask_token_id
    assert dc.num_target_layers in (None, oc.num_target_layers)
    assert model.num_context_features == len(oc.target_layer_ids)
    attn0 = model.layers[0].self_attn
    assert (attn0.num_heads, attn0.num_kv_heads, attn0.head_dim) == (
        oc.num_attention_heads, oc.num_key_value_heads, oc.head_dim)
    types = [(layer.self_attn.attn.attn_type.name, layer.self_attn.sliding_window_size) for layer in model.layers]
    log(f"per-layer attention (type, window): {types}; v_scale={attn0.v_scale}")
    assert ours.dims.windows == tuple(None if w == -1 else w + 1 for _, w in types)  # SGLang stores window-1


def check_numerics(model, ours) -> None:
    """Projections, context K/V, MLP and norms, then attention through SGLang's own backend."""
    from dflash_core.model import graph

    oc = ours.config
    w, dims = ours.weights(), ours.dims
    H, n, L = oc.hidden_size, len(oc.target_layer_ids), oc.num_hidden_layers
    g, d = oc.num_key_value_heads, oc.head_dim
    gen = torch.Generator().manual_seed(1234)
    C, Q, P0 = 13, oc.block_size, 1000  # context tokens, block tokens, first context position
    target_hidden = torch.randn(C, n * H, generator=gen)
    ctx_pos = torch.arange(P0, P0 + C)
    blk_pos = torch.arange(P0 + C, P0 + C + Q)
    noise = torch.randn(Q, H, generator=gen)
    x = torch.randn(C, H, generator=gen)
    res = torch.randn(C, H, generator=gen)

    with torch.no_grad():
        log("3a. project_target_hidden (fc + hidden_norm)")
        sg_ctx = model.project_target_hidden(target_hidden)
        our_ctx = graph.project_features(w, dims, target_hidden[None])[0]
        check("project_target_hidden", our_ctx, sg_ctx)

        log("3b. context K/V per layer (kv_proj_only -> apply_k_norm -> apply_k_rope)")
        our_k, our_v = graph.inject_context(w, dims, target_hidden[None], ctx_pos[None])  # [L,1,g,C,d]
        sg_kv = []
        for i, layer in enumerate(model.layers):
            attn = layer.self_attn
            k, v = attn.kv_proj_only(model.prepare_context_hidden_for_kv(layer, sg_ctx))
            k = attn.apply_k_norm(k)
            k = attn.apply_k_rope(ctx_pos, k)
            k = k.view(-1, attn.num_kv_heads, attn.head_dim)  # tokens-first, as the worker writes the cache
            v = v.view(-1, attn.num_kv_heads, attn.head_dim)
            sg_kv.append((k, v))
            check(f"layer {i} context K (normed, rotated)", our_k[i, 0].transpose(0, 1), k)
            check(f"layer {i} context V", our_v[i, 0].transpose(0, 1), v)

        log("3c. MLP and norms")
        for i, (layer, lw) in enumerate(zip(model.layers, w.layers)):
            gate, up = F.linear(x, lw.gate_up).chunk(2, dim=-1)
            check(f"layer {i} mlp", F.linear(F.silu(gate) * up, lw.down), layer.mlp(x))
            check(f"layer {i} input_layernorm", graph.rms_norm(x, lw.input_norm, dims.eps), layer.input_layernorm(x))
            check(f"layer {i} post_attention_layernorm", graph.rms_norm(x, lw.post_norm, dims.eps),
                  layer.post_attention_layernorm(x))
            out, new_res = layer.post_attention_layernorm(x, res)  # fused residual form the layer uses
            check(f"layer {i} post_attention_layernorm(x, res)", graph.rms_norm(x + res, lw.post_norm, dims.eps), out)
            check(f"layer {i}   ... returned residual", x + res, new_res)
            q_heads = torch.randn(C, oc.num_attention_heads, d, generator=gen)
            check(f"layer {i} q_norm", graph.rms_norm(q_heads, lw.q_norm, dims.eps),
                  layer.self_attn.q_norm(q_heads.reshape(-1, d)).view_as(q_heads))
        check("final norm", graph.rms_norm(x, w.norm, dims.eps), model.norm(x))
        check("hidden_norm", graph.rms_norm(x, w.hidden_norm, dims.eps), model.hidden_norm(x))

        log("3d. attention over [context ; block] with SGLang's torch_native backend")
        attention_checks(model, ours, w, dims, sg_kv, our_k, our_v, target_hidden, noise, ctx_pos, blk_pos,
                         C, Q, L, g, d)


def attention_checks(model, ours, w, dims, sg_kv, our_k, our_v, target_hidden, noise, ctx_pos, blk_pos,
                         C, Q, L, g, d):
    """Draft forward through RadixAttention + TorchNativeAttnBackend.

    The context K/V go into a real MHATokenToKVPool at slots [1, C] (as the worker's
    append path does with set_kv_buffer); the block is an EXTEND batch of Q tokens whose
    prefix is those C slots. The draft layers are ENCODER_ONLY, so attention is non-causal.
    """
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc, MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    from dflash_core.model import graph

    def make_backend():
        total = C + Q
        kv_pool = MHATokenToKVPool(size=total + 8, page_size=1, dtype=torch.float32, head_num=g,
                                   head_dim=d, layer_num=L, device="cpu", enable_memory_saver=False,
                                   enable_alt_stream=False)
        req_pool = ReqToTokenPool(size=2, max_context_len=total + 8, device="cpu", enable_memory_saver=False)
        slots = torch.arange(1, total + 1, dtype=torch.int64)  # slot 0 is the padding slot
        req_pool.write((1, slice(0, total)), slots.to(torch.int32))
        runner = SimpleNamespace(device="cpu", req_to_token_pool=req_pool, token_to_kv_pool=kv_pool)
        backend = TorchNativeAttnBackend(runner)
        ctx_loc, blk_loc = slots[:C], slots[C:]
        for layer, (k, v) in zip(model.layers, sg_kv):
            kv_pool.set_kv_buffer(layer.self_attn.attn, KVWriteLoc(ctx_loc, physical=True), k, v,
                                  layer.self_attn.attn.k_scale, layer.self_attn.attn.v_scale)
        fb = ForwardBatch(
            forward_mode=ForwardMode.EXTEND, batch_size=1,
            input_ids=torch.zeros(Q, dtype=torch.int64),
            req_pool_indices=torch.tensor([1], dtype=torch.int64),
            seq_lens=torch.tensor([total], dtype=torch.int64),
            out_cache_loc=blk_loc, seq_lens_sum=total,
            seq_lens_cpu=torch.tensor([total], dtype=torch.int64),
            positions=blk_pos,
            extend_prefix_lens=torch.tensor([C], dtype=torch.int64),
            extend_seq_lens=torch.tensor([Q], dtype=torch.int64),
            extend_prefix_lens_cpu=[C], extend_seq_lens_cpu=[Q], extend_num_tokens=Q,
        )
        fb.out_cache_loc_is_physical = True
        backend.init_forward_metadata(fb)
        return backend, kv_pool, fb

    # cache layout check: the pool holds what our injection computed
    backend, kv_pool, fb = make_backend()
    for i in range(L):
        slots = torch.arange(1, C + 1)
        check(f"layer {i} K in SGLang KV pool", our_k[i, 0].transpose(0, 1), kv_pool.get_key_buffer(i)[slots])
        check(f"layer {i} V in SGLang KV pool", our_v[i, 0].transpose(0, 1), kv_pool.get_value_buffer(i)[slots])

    # one decoder layer (layer 0), output = mlp_out + residual
    cos, sin = graph.rope_cos_sin(blk_pos[None], w.inv_freq, dims.rope_scaling, noise.dtype)
    ours0 = graph.draft_layer(w.layers[0], dims, noise[None], our_k[0], our_v[0], cos, sin, None)[0]
    with forward_context(ForwardContext(attn_backend=backend), forward_batch=fb):
        h, r = model.layers[0](blk_pos, noise, fb, None)
    check("layer 0 full decoder layer (attn + mlp)", ours0, h + r)
    # the block's own K/V that RadixAttention wrote into the pool match ours
    q_, k_blk, v_blk = F.linear(graph.rms_norm(noise, w.layers[0].input_norm, dims.eps), w.layers[0].qkv).split(
        [dims.num_heads * d, g * d, g * d], dim=-1)
    k_blk = graph.apply_rope(graph.rms_norm(k_blk.view(Q, g, d), w.layers[0].k_norm, dims.eps).transpose(0, 1),
                             cos[0][None], sin[0][None]).transpose(0, 1)
    check("layer 0 block K written by RadixAttention", k_blk, kv_pool.get_key_buffer(0)[fb.out_cache_loc])
    check("layer 0 block V written by RadixAttention", v_blk.view(Q, g, d), kv_pool.get_value_buffer(0)[fb.out_cache_loc])

    # the whole draft forward (all layers + final norm), on a fresh pool
    backend, kv_pool, fb = make_backend()
    masks = [None] * L
    assert all(win is None for win in dims.windows), "sliding-window drafts need masks here"
    ours_all = graph.draft_forward(w, dims, noise[None], blk_pos[None], our_k, our_v, masks)[0]
    with forward_context(ForwardContext(attn_backend=backend), forward_batch=fb):
        out = model(input_ids=fb.input_ids, positions=blk_pos, forward_batch=fb, input_embeds=noise)
    check(f"full draft forward ({L} layers + norm), hidden", ours_all, out.hidden_states)
    # and dflash_core's public module forward (no cache) agrees too
    pub = ours(noise[None], target_hidden[None], torch.cat([ctx_pos, blk_pos])[None])[0]
    check("Drafter.forward (public API) vs SGLang", pub, out.hidden_states)

    # negative controls: the comparisons above can fail (context and positions matter)
    no_ctx = graph.draft_forward(w, dims, noise[None], blk_pos[None], our_k[:, :, :, :0], our_v[:, :, :, :0], masks)[0]
    shifted = graph.draft_forward(w, dims, noise[None], blk_pos[None] + 1, our_k, our_v, masks)[0]
    for label, other in (("without the context K/V", no_ctx), ("with block positions shifted by 1", shifted)):
        diff = maxdiff(other, out.hidden_states)
        print(f"    control: ours {label:<36s} max|diff| = {diff:.3e} (must be > 1e-2)")
        assert diff > 1e-2, f"negative control {label!r} does not differ: the check has no teeth"


def cli(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python tests/plugins/sglang_numerics.py DRAFT_DIR", file=sys.stderr)
        return 2
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # CPU only, even where a GPU exists
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(1)
    try:
        main(argv[0])
    except Exception:
        import traceback

        traceback.print_exc()
        print("SGLANG CHECK FAILED")
        return 1
    print("SGLANG CHECK OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(cli())
