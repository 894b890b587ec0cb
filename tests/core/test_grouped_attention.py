"""The target's grouped-query attention on the CPU: no K/V copy per group, the same numbers, nothing left changed."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from dflash_core.decode.autoregressive import generate_autoregressive
from dflash_core.decode.loop import generate
from dflash_core.kernels.grouped_attention import ATTENTION_NAME
from dflash_core.target.adapter import TargetModel, cache_argument
from transformers.utils.generic import is_flash_attention_requested
from tiny import drafter_config, tiny_drafter, tiny_target


def _verify_forward(target: TargetModel, context: int, new: int):
    """Hidden states of `new` tokens after `context` cached ones (a verify: masked attention), and the
    attention implementation each layer saw."""
    ids = torch.randint(0, 64, (1, context + new), generator=torch.Generator().manual_seed(3))
    positions = torch.arange(context + new)[None]
    seen = []
    hooks = [layer.register_forward_pre_hook(lambda module, args: seen.append(module.self_attn.config._attn_implementation))
             for layer in target.base.layers]
    try:
        cache = DynamicCache()
        with torch.inference_mode():
            target(ids[:, :context], positions[:, :context], cache)
            seen.clear()
            hidden = target(ids[:, context:], positions[:, context:], cache).hidden
    finally:
        for hook in hooks:
            hook.remove()
    return hidden, seen


def test_a_verify_attends_grouped_and_matches_hugging_faces_own_path():
    model = tiny_target(layers=3, heads=4, kv_heads=2, seed=2)
    target = TargetModel(model, [1])
    hidden, seen = _verify_forward(target, context=40, new=6)
    assert seen == [ATTENTION_NAME] * 3  # every layer, for this forward only
    assert model.config._attn_implementation == "sdpa"
    # Hugging Face's own masked SDPA path (K/V repeated per group), the model called directly over the same cache
    ids = torch.randint(0, 64, (1, 46), generator=torch.Generator().manual_seed(3))
    positions = torch.arange(46)[None]
    cache = DynamicCache()
    with torch.inference_mode():
        kwargs = {cache_argument(model.model): cache, "use_cache": True}
        model.model(input_ids=ids[:, :40], position_ids=positions[:, :40], **kwargs)
        reference = model.model(input_ids=ids[:, 40:], position_ids=positions[:, 40:], **kwargs).last_hidden_state
    assert cache.get_seq_length() == 46  # the cache was used: the reference attended to the context through a mask
    torch.testing.assert_close(hidden, reference, rtol=1e-6, atol=1e-6)


def test_transformers_does_not_take_the_switch_for_flash_attention():
    # transformers treats any implementation named "...flash..." as FlashAttention (masks, padding-free paths)
    assert not is_flash_attention_requested(requested_attention_implementation=ATTENTION_NAME)


def test_models_without_grouped_heads_and_single_tokens_keep_their_path():
    model = tiny_target(layers=2, heads=4, kv_heads=4, seed=1)
    _, seen = _verify_forward(TargetModel(model), context=10, new=4)
    assert seen == ["sdpa"] * 2
    model = tiny_target(layers=2, heads=4, kv_heads=2, seed=1)
    model.config._attn_implementation = "eager"
    _, seen = _verify_forward(TargetModel(model), context=10, new=4)
    assert seen == ["eager"] * 2


def test_decoding_with_grouped_attention_stays_lossless_on_ragged_batches():
    model = tiny_target(layers=3, heads=4, kv_heads=2, vocab=64, seed=4)
    drafter = tiny_drafter(drafter_config(model, block_size=6), seed=4)
    ids = torch.tensor([[0, 0, 5, 9, 11, 3], [7, 8, 9, 7, 8, 9]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])  # rows of different lengths: a ragged 4D mask
    for draft_length in ("auto", 5):
        spec = generate(model, drafter, ids, attention_mask=mask, max_new_tokens=24, draft_length=draft_length)
        alone = generate_autoregressive(model, ids, attention_mask=mask, max_new_tokens=24)
        assert spec.tokens == alone.tokens
    # and Hugging Face's own greedy generate (its repeat_kv path) on the unpadded row
    with torch.inference_mode():
        hf = model.generate(ids[1:], max_new_tokens=24, do_sample=False, pad_token_id=0)
    assert spec.tokens[1] == hf[0, ids.shape[1]:].tolist()
    assert model.config._attn_implementation == "sdpa"
