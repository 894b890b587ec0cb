"""Target adapter: features from hooks on exactly the chosen layers; the layer-index convention."""

from __future__ import annotations

import pytest
import torch
from dflash_core import CompatibilityError, TargetModel, check_compatibility, ensure_mask_token
from tiny import ARCHS, drafter_config, tiny_target
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_layer_id_k_is_hf_hidden_states_k_plus_1(arch):
    """Pinned convention: id k = output of decoder layer k = hidden_states[k + 1] (0 is the embedding)."""
    model = tiny_target(arch, layers=5)
    ids = torch.randint(0, 60, (2, 9))
    with torch.no_grad():
        hf = model(ids, output_hidden_states=True).hidden_states
        for layer_ids in [(0,), (1, 3), (0, 1, 2, 3)]:
            out = TargetModel(model, layer_ids)(ids, torch.arange(9).expand(2, -1))
            want = torch.cat([hf[k + 1] for k in layer_ids], dim=-1)
            assert torch.equal(out.features, want)
        assert torch.allclose(model.lm_head(out.hidden), model(ids).logits, atol=1e-5)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_features_alone_equal_the_whole_forwards_and_skip_the_layers_above(arch):
    """`features` (training's hard-label forward) returns `forward(...).features` to the bit from a ragged
    batch, never runs a layer above the last feature layer, and leaves no hook behind."""
    model = tiny_target(arch, layers=5)
    ids = torch.randint(0, 60, (2, 9))
    valid = torch.ones(2, 9, dtype=torch.long)
    valid[1, 6:] = 0  # a shorter row, as training batches pad
    positions = torch.arange(9).expand(2, -1)
    ran = []
    for index, layer in enumerate(model.model.layers):
        layer.register_forward_pre_hook(lambda module, args, index=index: ran.append(index))
    with torch.no_grad():
        for layer_ids in [(0,), (1, 3), (2,), (0, 2, 4)]:
            target = TargetModel(model, layer_ids)
            whole = target(ids, positions, None, valid).features
            ran.clear()
            alone = target.features(ids, positions, valid)
            assert ran == list(range(max(layer_ids) + 1))
            assert torch.equal(alone, whole)
    for layer in model.model.layers:
        assert not layer._forward_hooks
    with pytest.raises(ValueError, match="no target_layer_ids"):
        TargetModel(model, ()).features(ids, positions)


def test_hooks_are_removed_and_only_chosen_layers_hooked():
    model = tiny_target(layers=4)
    target = TargetModel(model, (1, 2))
    seen = []
    original = [layer.forward for layer in model.model.layers]
    with torch.no_grad():
        target(torch.zeros(1, 3, dtype=torch.long), torch.arange(3)[None])
    for layer in model.model.layers:
        assert not layer._forward_hooks
    assert [layer.forward for layer in model.model.layers] == original
    assert seen == []


def test_embedding_and_head_are_the_targets():
    model = tiny_target()
    target = TargetModel(model, (1,))
    ids = torch.tensor([[3, 4, 5]])
    assert torch.equal(target.embed(ids), model.model.embed_tokens(ids))
    h = torch.randn(1, 3, 32)
    # the head's own product, in whichever layout `matmul_layout` timed faster here: equal up to the order of
    # the additions (it failed once as torch.equal when the transposed layout won the timing)
    torch.testing.assert_close(target.logits(h), model.lm_head(h), rtol=1e-5, atol=1e-6)
    assert (target.num_layers, target.hidden_size, target.vocab_size) == (4, 32, 64)


def test_unsupported_model_is_named():
    with pytest.raises(CompatibilityError, match="not a supported causal LM"):
        TargetModel(torch.nn.Linear(2, 2))


def test_layer_ids_out_of_range():
    with pytest.raises(CompatibilityError, match=r"reach layer 4, but the target has 4 layers"):
        TargetModel(tiny_target(layers=4), (1, 4))


@pytest.mark.parametrize("kwargs,pattern", [
    (dict(hidden=64, heads=4), r"hidden_size is 64 but the target's is 32"),
    (dict(target_layers=6), r"made for a 6-layer target but this target has 4 layers"),
    (dict(mask_token_id=70, vocab=80), r"mask_token_id is 70 but the target's embedding has only 64 rows"),
])
def test_compatibility_mismatches(kwargs, pattern):
    target = TargetModel(tiny_target(layers=4))
    cfg = drafter_config(**{"hidden": 32, "target_layers": 4, "vocab": 64, **kwargs})
    with pytest.raises(CompatibilityError, match=pattern) as info:
        check_compatibility(cfg, target)
    assert "\n" not in str(info.value)


def test_layer_ids_beyond_target():
    target = TargetModel(tiny_target(layers=4))
    cfg = drafter_config(hidden=32, target_layers=8, vocab=64, layer_ids=(2, 6)).replace(num_target_layers=None)
    with pytest.raises(CompatibilityError, match=r"reach layer 6 but the target has 4 layers"):
        check_compatibility(cfg, target)


def _tokenizer(words):
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token=words[0])


def test_mask_token_added_when_missing():
    tok = _tokenizer(["<unk>", "a", "b"])
    note = ensure_mask_token(tok, drafter_config(vocab=64, mask_token_id=3))
    assert note == "the tokenizer had no mask token: added <|MASK|> as id 3."
    assert tok.convert_tokens_to_ids("<|MASK|>") == 3
    assert ensure_mask_token(tok, drafter_config(vocab=64, mask_token_id=3)) is None


def test_mask_token_under_another_id_is_refused():
    tok = _tokenizer(["<unk>", "<|MASK|>", "b"])
    with pytest.raises(CompatibilityError, match=r"has <\|MASK\|> as id 1 but the drafter's mask_token_id is 2"):
        ensure_mask_token(tok, drafter_config(vocab=64, mask_token_id=2))


def test_mask_token_id_existing_or_beyond_tokenizer():
    tok = _tokenizer(["<unk>", "a", "b"])
    assert "existing token 'b'" in ensure_mask_token(tok, drafter_config(vocab=64, mask_token_id=2))
    assert "embedding row only" in ensure_mask_token(tok, drafter_config(vocab=64, mask_token_id=40))
