"""`dflash train --grow-from`: a deeper drafter, fed by more target layers, grown from a trained one.

The grown drafter starts as the same function as the given one (so no training is lost), refuses what
it cannot grow from in one line, keeps the setting in its training state, writes the published format
and still decodes losslessly after training.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from tiny import drafter_config, tiny_drafter, tiny_target

from dflash_core import generate, load_drafter
from dflash_core.model.drafter import Drafter
from dflash_core.errors import ConfigError
from dflash_core.training.grow import grow_from_drafter, growth_problem
from dflash_core.training.train_state import load_training_state



def _source(tmp_path, **extra):
    """A trained-looking (random, non-zero) 1-layer drafter fed by layer 3 of a 6-layer target, on disk."""
    model = tiny_target(vocab=64, layers=6, seed=1)
    config = drafter_config(model, layers=1, block_size=4, layer_ids=(3,), **extra)
    path = tmp_path / "source"
    tiny_drafter(config, seed=2).save_pretrained(path)
    return model, config, path


def _grown(config, layers, ids):
    drafter = Drafter(replace(config, num_hidden_layers=layers, target_layer_ids=tuple(ids)))
    drafter.reset_parameters(0.2, torch.Generator().manual_seed(5))
    return drafter.eval()


@pytest.mark.parametrize("layers,ids", [(2, (0, 1, 2, 3, 4, 5)), (3, (3,)), (1, (1, 3, 5))])
def test_the_grown_drafter_computes_what_it_grew_from(tmp_path, layers, ids):
    _, config, path = _source(tmp_path)
    source = load_drafter(path).eval()
    grown = _grown(config, layers, ids)
    assert grow_from_drafter(grown, path) == {"layers": (1, layers), "target_layer_ids": ([3], list(ids))}
    g = torch.Generator().manual_seed(0)
    features = torch.randn(2, 9, 6, 32, generator=g)  # [B, ctx, every target layer, H]
    noise = torch.randn(2, 4, 32, generator=g)
    positions = torch.arange(13).expand(2, -1)
    with torch.no_grad():
        want = source(noise, features[:, :, 3], positions)
        got = grown(noise, features[:, :, list(ids)].flatten(2), positions)
    assert (got - want).abs().max().item() < 1e-5
    # the new capacity is really there: its inputs are live, only the outputs start at zero
    for layer in grown.layers[1:]:
        assert layer.self_attn.o_proj.weight.abs().max() == 0 and layer.mlp.down_proj.weight.abs().max() == 0
        assert layer.self_attn.q_proj.weight.abs().max() > 0 and layer.mlp.up_proj.weight.abs().max() > 0


def test_what_cannot_grow_is_refused_naming_it(tmp_path):
    _, config, path = _source(tmp_path)
    cases = [
        (replace(config, num_hidden_layers=2, target_layer_ids=(3,), block_size=8), r"block_size \(4 there, 8 here\)"),
        (replace(config, target_layer_ids=(1, 2)), r"\[3\] would be dropped"),
        (config, "nothing: the same depth and feature layers"),
    ]
    for grown, pattern in cases:
        with pytest.raises(ConfigError, match=pattern):
            grow_from_drafter(Drafter(grown), path)
    deeper = replace(config, num_hidden_layers=3)
    assert "it can only grow" in growth_problem(deeper, config)
    assert growth_problem(config, replace(config, intermediate_size=96)).startswith("intermediate_size (64 there")


# the levers' tiny 6-layer pair and its data, and their 2-step training command
from test_training_levers import _train, setup as pair  # noqa: E402,F401


def test_grow_from_trains_round_trips_and_decodes_losslessly(pair, tmp_path, capsys):
    target, data = pair
    small, grown = tmp_path / "small", tmp_path / "grown"
    assert _train(target, data, small) == 0
    before = {f.name: f.read_bytes() for f in small.rglob("*") if f.is_file()}
    assert _train(target, data, grown, "--grow-from", str(small), "--layers", "2", "--feature-layers", "6") == 0
    assert {f.name: f.read_bytes() for f in small.rglob("*") if f.is_file()} == before  # the input is untouched
    _, meta = load_training_state(grown / "train_state")
    assert meta["train"]["grow_from"] == str(small) and meta["step"] == 2
    drafter = load_drafter(grown)
    config = json.loads((grown / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["dflash_config"]["target_layer_ids"] == [0, 1, 2, 3, 4, 5]
    assert drafter.fc.weight.shape == (32, 6 * 32)
    # two steps moved the new layer off zero: it trains
    assert drafter.layers[1].mlp.down_proj.weight.abs().max() > 0
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target)
    ids_in = torch.tensor([[5, 9, 11, 3, 7]])
    want = model.generate(ids_in, attention_mask=torch.ones_like(ids_in), max_new_tokens=16, do_sample=False,
                          pad_token_id=0)[0, 5:].tolist()
    assert generate(model, drafter, ids_in, max_new_tokens=16).tokens[0] == want
    # resuming with another starting point is refused, naming it; a bad growth leaves nothing behind
    capsys.readouterr()
    assert _train(target, data, grown, "--max-steps", "3", "--layers", "2", "--feature-layers", "6") == 2
    assert "grow_from" in capsys.readouterr().err
    assert _train(target, data, tmp_path / "bad", "--grow-from", str(small)) == 2
    err = capsys.readouterr().err
    assert "nothing: the same depth and feature layers" in err and len(err.strip().splitlines()) == 1, err
    assert _train(target, data, tmp_path / "bad", "--grow-from", str(small), "--init-from", str(small),
                  "--layers", "2") == 2
    assert "one starting point or the other" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
