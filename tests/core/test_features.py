"""`dflash features` and `dflash train --features`: target features stored once; training from them equals training
from the live target, loss for loss; a stale cache, an interrupted extraction and bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from tiny import save_tiny_pair

from dflash_cli import main
from dflash_core import load_drafter
from dflash_core.errors import CompatibilityError, DataError
from dflash_core.loading import load_target
from dflash_core.target.pieces import load_target_pieces
from dflash_core.training.data import TokenDataset, data_fingerprint, target_fingerprint
from dflash_core.training.features import FeatureCache, FeatureSettings, extract_features
from dflash_core.training.train_state import load_training_state

FAST = ["--dtype", "fp32", "--threads", "1"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("features")
    target, _ = save_tiny_pair(root, target_layers=6)  # 6 layers: the spacings for 1 and 3 feature layers differ
    lines = Path(__file__).read_text().splitlines()
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": "\n".join(lines[i:i + 3])}) + "\n" for i in range(0, 48, 2)))
    data = root / "data"
    assert main(["data", "--target", str(target), "--prompts", str(prompts), "--out", str(data),
                 "--max-new-tokens", "16", "--batch-size", "8", "--shard-size", "8", *FAST]) == 0
    features = root / "features"
    assert main(["features", "--target", str(target), "--data", str(data), "--out", str(features),
                 "--feature-layers", "1,3", "--store-dtype", "fp32", "--shard-size", "5", "--batch-tokens", "64",
                 "--no-progress", *FAST]) == 0
    return root, target, data, features


def _train(target, data, out, *extra):
    return main(["train", "--target", str(target), "--data", str(data), "--out", str(out), "--block-size", "4",
                 "--anchors", "6", "--batch-size", "3", "--no-progress", *FAST, *extra])


def test_stored_features_are_the_targets_own(setup):
    _, target_dir, data_dir, features_dir = setup
    data, cache = TokenDataset(data_dir), FeatureCache(features_dir)
    assert cache.settings.layer_ids == (1, 2, 3) and len(cache) == len(data) == 24  # the middle layer, then 1..L-3
    assert len(cache.index["shards"]) == 5  # 24 samples, 5 a shard
    target = load_target(target_dir, (1, 2, 3), "fp32")
    for i in (0, 7, 23):
        tokens = torch.from_numpy(data[i].tokens.astype("int64"))[None]
        with torch.no_grad():
            want = target.features(tokens, torch.arange(tokens.shape[1])[None])[0]  # [T, 3*H]
        got = cache.sample(i, tokens.shape[1], [0, 1, 2])
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), i
        assert torch.equal(cache.sample(i, 5, [2]), got[:5, 64:])  # layer 3's columns, a prefix of the positions


def test_training_from_stored_features_equals_training_from_the_live_target(setup, tmp_path):
    _, target, data, features = setup
    args = ["--max-steps", "6", "--seed", "5", "--lr", "3e-3"]
    assert _train(target, data, tmp_path / "live", *args) == 0
    assert _train(target, data, tmp_path / "stored", "--features", str(features), *args) == 0
    _, live = load_training_state(tmp_path / "live" / "train_state")
    _, stored = load_training_state(tmp_path / "stored" / "train_state")
    assert stored["drafter"] == live["drafter"] and stored["drafter"]["dflash_config"]["target_layer_ids"] == [3]
    assert stored["history"] == pytest.approx(live["history"], rel=1e-5)
    assert stored["history"][-1] < stored["history"][0]
    a, b = load_drafter(tmp_path / "live"), load_drafter(tmp_path / "stored")
    for x, y in zip(a.state_dict().values(), b.state_dict().values()):
        assert torch.allclose(x.float(), y.float(), atol=1e-2)  # the published bf16 copies of near-equal weights


def test_the_target_pieces_are_its_embedding_and_head_and_never_run(setup):
    _, target_dir, _, _ = setup
    pieces, whole = load_target_pieces(target_dir, "fp32"), load_target(target_dir, (), "fp32")
    assert pieces.num_layers == whole.num_layers and pieces.vocab_size == whole.vocab_size
    ids = torch.tensor([[3, 4, 5]])
    assert torch.equal(pieces.embed(ids), whole.embed(ids))
    assert torch.equal(pieces.plain_head_weight(), whole.plain_head_weight())
    with pytest.raises(CompatibilityError, match="holds only its embedding and LM head"):
        pieces.features(ids, torch.arange(3)[None])


def test_a_cache_refuses_another_target_other_data_and_layers_it_lacks(setup, tmp_path, capsys):
    root, target, data, features = setup
    other_target, _ = save_tiny_pair(tmp_path / "other", seed=1)
    assert _train(other_target, data, tmp_path / "a", "--features", str(features), "--max-steps", "1") == 2
    assert "was made from another target" in capsys.readouterr().err
    half = tmp_path / "half"  # the first shard of the data set alone
    half.mkdir()
    index = json.loads((data / "index.json").read_text())
    index["shards"] = index["shards"][:1]
    (half / "index.json").write_text(json.dumps(index))
    shutil.copy(data / index["shards"][0]["file"], half)
    assert _train(target, half, tmp_path / "b", "--features", str(features), "--max-steps", "1") == 2
    assert "was made from other data" in capsys.readouterr().err
    assert _train(target, data, tmp_path / "c", "--features", str(features), "--target-layer-ids", "0",
                  "--max-steps", "1") == 2
    assert "holds layers [1, 2, 3]" in capsys.readouterr().err
    assert _train(target, data, tmp_path / "d", "--features", str(features), "--distill", "mix",
                  "--max-steps", "1") == 2
    err = capsys.readouterr().err
    assert "holds no final hidden states" in err and len(err.strip().splitlines()) == 1
    assert not any((tmp_path / name).exists() for name in "abcd")


class _Interrupted(KeyboardInterrupt):
    pass


def test_an_interrupted_extraction_resumes_shard_by_shard(setup, tmp_path):
    _, target_dir, data_dir, features = setup
    data = TokenDataset(data_dir)
    target = load_target(target_dir, (), "fp32")
    settings = FeatureSettings(target=target_fingerprint(target_dir), data=data_fingerprint(data), layer_ids=(1, 2, 3),
                               compute_dtype="fp32", store_dtype="fp32", shard_size=5)
    calls, features_of = [0], target.features

    def failing(*args, **kwargs):  # a forward of a middle shard (one or two samples a forward) is interrupted
        calls[0] += 1
        if calls[0] == 12:
            raise _Interrupted
        return features_of(*args, **kwargs)

    target.features = failing
    out = tmp_path / "features"
    with pytest.raises(_Interrupted):
        extract_features(target, data, out, settings, batch_tokens=64, progress=False)
    done = json.loads((out / "index.json").read_text())
    assert 0 < len(done["shards"]) < 5 and not list(out.glob(".*.tmp"))
    target.features = features_of
    extract_features(target, data, out, settings, batch_tokens=64, progress=False)
    for name in ["index.json"] + [f"features-{k:05d}.safetensors" for k in range(5)]:
        assert (out / name).read_bytes() == (features / name).read_bytes(), name


def test_bad_feature_inputs_are_one_line(setup, tmp_path, capsys):
    root, target, data, features = setup
    run = ["features", "--target", str(target), "--data", str(data), "--no-progress", *FAST]
    assert main([*run, "--out", str(features), "--feature-layers", "1,3", "--shard-size", "5"]) == 2
    assert "store_dtype differ" in capsys.readouterr().err  # the cache was stored in fp32, this asks for bf16
    assert main([*run, "--out", str(tmp_path / "x"), "--target-layer-ids", "1,6"]) == 2
    assert "reach layer 6, but the target has 6 layers" in capsys.readouterr().err
    assert main([*run, "--out", str(data)]) == 2  # the data set itself
    capsys.readouterr()
    broken = tmp_path / "broken"
    shutil.copytree(features, broken)
    shard = broken / "features-00001.safetensors"
    shard.write_bytes(shard.read_bytes()[:-8] + b"01234567")
    with pytest.raises(DataError, match="features-00001.safetensors is corrupt"):
        FeatureCache(broken)
    index = json.loads((broken / "index.json").read_text())
    index["shards"] = index["shards"][:2]
    (broken / "index.json").write_text(json.dumps(index))
    assert _train(target, data, tmp_path / "t", "--features", str(broken), "--max-steps", "1") == 2
    err = capsys.readouterr().err
    assert "is incomplete (10 of 24 samples)" in err and len(err.strip().splitlines()) == 1
