"""DFlashConfig: the published format parses, round-trips, and every bad field gives one sentence."""

from __future__ import annotations

import json

import pytest
from dflash_core import ConfigError, DFlashConfig, build_target_layer_ids
from tiny import drafter_config

PUBLISHED = {  # the shape of z-lab's Qwen3-8B-DFlash-b16 config.json (dimensions of the real thing)
    "architectures": ["DFlashDraftModel"],
    "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
    "attention_bias": False, "attention_dropout": 0.0, "block_size": 16,
    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
    "dtype": "bfloat16", "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 12288, "layer_types": ["full_attention"] * 5,
    "max_position_embeddings": 40960, "max_window_layers": 5, "model_type": "qwen3",
    "num_attention_heads": 32, "num_hidden_layers": 5, "num_key_value_heads": 8, "num_target_layers": 36,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": False, "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}


def test_published_config_parses():
    c = DFlashConfig.from_dict(PUBLISHED)
    assert c.block_size == 16 and c.mask_token_id == 151669
    assert c.target_layer_ids == (1, 9, 17, 25, 33)
    assert c.fc_in_features == 5 * 4096
    assert c.head_dim == 128 and c.num_key_value_heads == 8
    assert c.extra["auto_map"] == {"AutoModel": "dflash.DFlashDraftModel"}


def test_round_trip_through_disk(tmp_path):
    c = DFlashConfig.from_dict(PUBLISHED)
    c.save_pretrained(tmp_path)
    again = DFlashConfig.from_pretrained(tmp_path)
    assert again == c
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["dflash_config"] == {"target_layer_ids": [1, 9, 17, 25, 33], "mask_token_id": 151669}
    assert written["block_size"] == 16 and written["architectures"] == ["DFlashDraftModel"]
    assert DFlashConfig.from_dict(written).to_dict() == written


def test_top_level_dflash_keys_and_defaults():
    raw = {k: v for k, v in PUBLISHED.items() if k != "dflash_config"}
    raw |= {"mask_token_id": 7, "target_layer_ids": [2, 4, 6, 8, 10]}
    c = DFlashConfig.from_dict(raw)
    assert c.mask_token_id == 7 and c.target_layer_ids == (2, 4, 6, 8, 10)
    raw.pop("target_layer_ids")
    assert DFlashConfig.from_dict(raw).target_layer_ids == build_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)


def test_default_layer_ids_follow_the_reference():
    assert build_target_layer_ids(36, 1) == (18,)
    assert build_target_layer_ids(28, 3) == (1, 13, 25)
    with pytest.raises(ConfigError, match="at least 4 target layers"):
        build_target_layer_ids(3, 2)


def test_rope_parameters_form_is_understood():
    raw = dict(PUBLISHED)
    raw.pop("rope_theta")
    raw["rope_parameters"] = {"rope_type": "linear", "rope_theta": 5e5, "factor": 2.0}
    c = DFlashConfig.from_dict(raw)
    assert c.rope_theta == 5e5 and c.rope_scaling["rope_type"] == "linear"


def _bad(**changes):
    raw = json.loads(json.dumps(PUBLISHED))
    for key, value in changes.items():
        if key.startswith("dflash_"):
            raw["dflash_config"][key[len("dflash_"):]] = value
        elif value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    return raw


@pytest.mark.parametrize("changes,pattern", [
    ({"block_size": 1}, r"'block_size' is 1, expected an integer >= 2"),
    ({"block_size": None}, r"'block_size' is missing"),
    ({"dflash_target_layer_ids": []}, r"'target_layer_ids' is empty"),
    ({"dflash_target_layer_ids": [1, 1, 2]}, r"expected unique layer ids"),
    ({"dflash_target_layer_ids": [9, 1]}, r"expected ascending order"),
    ({"dflash_target_layer_ids": [1, 36]}, r"within \[0, 36\)"),
    ({"dflash_target_layer_ids": [-1, 3]}, r"within \[0, 36\)"),
    ({"dflash_target_layer_ids": "1,2"}, r"expected a list of integers"),
    ({"dflash_mask_token_id": 151936}, r"'mask_token_id' is 151936, expected an id within the vocabulary"),
    ({"num_key_value_heads": 5}, r"'num_key_value_heads' is 5, expected a divisor of num_attention_heads \(32\)"),
    ({"head_dim": 127}, r"'head_dim' is 127, expected an even number"),
    ({"hidden_size": 0}, r"'hidden_size' is 0, expected a positive integer"),
    ({"hidden_size": "4096"}, r"'hidden_size' is '4096', expected an integer"),
    ({"intermediate_size": None}, r"'intermediate_size' is missing"),
    ({"architectures": ["LlamaForCausalLM"]}, r"unknown architecture"),
    ({"hidden_act": "gelu"}, r"'hidden_act' is 'gelu', expected 'silu'"),
    ({"layer_types": ["full_attention"] * 4}, r"'layer_types' .* expected 5 entries"),
    ({"layer_types": ["sliding_attention"] * 5}, r"'sliding_window' is None, expected a positive integer"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, r"rope_type 'dynamic'"),
    ({"rms_norm_eps": -1.0}, r"'rms_norm_eps' is -1.0"),
    ({"dtype": "int8"}, r"'dtype' is 'int8'"),
])
def test_bad_fields_give_one_line(changes, pattern):
    with pytest.raises(ConfigError, match=pattern) as info:
        DFlashConfig.from_dict(_bad(**changes))
    assert "\n" not in str(info.value)


def test_mask_token_missing(tmp_path):
    raw = _bad()
    del raw["dflash_config"]["mask_token_id"]
    with pytest.raises(ConfigError, match="mask_token_id' is missing"):
        DFlashConfig.from_dict(raw)


def test_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        DFlashConfig.from_pretrained(tmp_path / "nope")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        DFlashConfig.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="JSON object"):
        DFlashConfig.from_pretrained(tmp_path)


def test_config_is_frozen():
    c = drafter_config()
    with pytest.raises(AttributeError):
        c.block_size = 8  # type: ignore[misc]
    assert c.replace(block_size=8).block_size == 8
