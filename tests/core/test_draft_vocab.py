"""The drafts' read-out vocabulary (`draft_vocab.json`): which ids it keeps, how it is read, that drafts
come only from it, and that decoding with it stays exactly the target's greedy output."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from test_greedy_lossless import target_greedy
from tiny import drafter_config, save_tiny_pair, tiny_drafter, tiny_target
from transformers import AutoConfig

from dflash_core import generate, load_drafter
from dflash_core.model.draft_vocab import (DRAFT_VOCAB_FILE, ROUND_TO, SubsetReadOut, choose_draft_vocab, count_tokens,
                                     load_draft_vocab, read_out_for, save_draft_vocab)
from dflash_core.errors import CheckpointError
from dflash_core.target.adapter import TargetModel
from dflash_core.training.data import TokenDataset


def test_counts_and_the_smallest_covering_list_rounded_up():
    counts = count_tokens([np.array([3, 3, 3, 5]), np.array([3, 7, 5, 3])], vocab_size=200)
    assert counts[3] == 5 and counts[5] == 2 and counts[7] == 1 and counts.sum() == 8
    ids, coverage = choose_draft_vocab(counts, coverage=0.6)  # token 3 alone covers 5/8 = 0.625
    assert len(ids) == ROUND_TO and 3 in ids and ids == sorted(ids) and coverage == 1.0  # rounding adds 5, 7
    many = np.zeros(300, dtype=np.int64)
    many[:130] = np.arange(130, 0, -1)  # id i occurs 130 - i times
    ids, coverage = choose_draft_vocab(many, coverage=0.999)
    assert len(ids) == 2 * ROUND_TO and ids == list(range(128)) and 0.999 <= coverage < 1.0
    assert choose_draft_vocab(many, coverage=1.0)[0] == list(range(192))  # every written token, rounded
    with pytest.raises(ValueError, match="no tokens"):
        choose_draft_vocab(np.zeros(10, dtype=np.int64))


def test_file_round_trip_and_bad_files_are_one_line(tmp_path):
    assert load_draft_vocab(tmp_path) is None  # no file: the whole vocabulary
    save_draft_vocab(tmp_path, [9, 2, 5], 0.99, "hand")
    assert load_draft_vocab(tmp_path, vocab_size=10) == [2, 5, 9]
    path = tmp_path / DRAFT_VOCAB_FILE
    bad = {"[1, 2]": "holds a JSON array, expected an object", '{"token_ids": []}': "non-empty list of integers",
           '{"token_ids": [1, true]}': "non-empty list of integers", '{"token_ids": [4, 4]}': "repeats an id",
           '{"token_ids": [1, 10]}': r"token id 10 is outside the target's vocabulary \[0, 10\)",
           "{": "is not valid JSON",
           '{"token_ids": [1], "sampled_over_list": "yes"}': "'sampled_over_list' is 'yes', expected true or false"}
    for text, message in bad.items():
        path.write_text(text)
        with pytest.raises(CheckpointError, match=message) as info:
            load_draft_vocab(tmp_path, vocab_size=10)
        assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_subset_read_out_is_the_argmax_over_its_rows():
    generator = torch.Generator().manual_seed(0)
    for bias in (False, True):
        head = torch.nn.Linear(16, 50, bias=bias)
        hidden = torch.randn(3, 5, 16, generator=generator)
        ids = sorted(random.Random(1).sample(range(50), 12))
        tokens = SubsetReadOut(head, ids)(hidden)  # [3, 5]
        masked = torch.full((50,), float("-inf"))
        masked[ids] = 0.0
        assert torch.equal(tokens, (head(hidden) + masked).argmax(-1))
        assert set(tokens.flatten().tolist()) <= set(ids)
    with pytest.raises(CheckpointError, match="outside the target's LM head"):
        SubsetReadOut(torch.nn.Linear(4, 8), [3, 8])


@pytest.mark.parametrize("seed", range(6))
def test_greedy_with_a_draft_vocabulary_equals_the_target_and_drafts_come_from_it(seed):
    rng = random.Random(seed)
    vocab = 64
    model = tiny_target("qwen3", vocab=vocab, layers=3, hidden=32, seed=seed)
    drafter = tiny_drafter(drafter_config(model, block_size=rng.choice([4, 8])), seed=seed, std=0.3)
    prompt = [rng.randrange(vocab - 1) for _ in range(rng.randint(2, 12))]
    expected = target_greedy(model, prompt, 30)
    drafter.draft_vocab = sorted(rng.sample(range(vocab), 10) + expected[:3])  # some right tokens, most not
    drafter.draft_vocab = sorted(set(drafter.draft_vocab))
    proposed = []
    original = drafter.propose
    drafter.propose = lambda *args: proposed.append(original(*args)) or proposed[-1]
    result = generate(model, drafter, torch.tensor([prompt]), max_new_tokens=30, draft_length=drafter.config.block_size - 1)
    assert result.tokens[0] == expected
    assert proposed and all(set(p.flatten().tolist()) <= set(drafter.draft_vocab) for p in proposed)


def test_read_out_is_made_once_per_head_and_follows_a_new_list():
    model = tiny_target("qwen3", vocab=64, layers=2, hidden=32, seed=0)
    target = TargetModel(model, (0,))
    drafter = tiny_drafter(drafter_config(model, layer_ids=(0,)))
    hidden = torch.randn(1, 3, 32)
    assert torch.equal(read_out_for(drafter, target)(hidden), model.lm_head(hidden).argmax(-1))  # no list: all
    drafter.draft_vocab = [1, 2, 3]
    first = read_out_for(drafter, target)
    assert read_out_for(drafter, target) is first
    drafter.draft_vocab = [4, 5]
    assert set(read_out_for(drafter, target)(hidden).flatten().tolist()) <= {4, 5}


def test_training_writes_the_list_and_the_drafter_loads_it(tmp_path):
    from dflash_cli import main

    target, _ = save_tiny_pair(tmp_path, target_layers=4)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"def f{i}(x):\n    return x"}) + "\n" for i in range(6)))
    fast = ["--dtype", "fp32", "--threads", "1"]
    assert main(["data", "--target", str(target), "--prompts", str(prompts), "--out", str(tmp_path / "data"),
                 "--max-new-tokens", "12", "--batch-size", "6", *fast]) == 0
    common = ["train", "--target", str(target), "--data", str(tmp_path / "data"), "--block-size", "4",
              "--anchors", "4", "--batch-size", "2", "--max-steps", "1", "--no-progress", *fast]
    assert main([*common, "--out", str(tmp_path / "with")]) == 0
    listed = json.loads((tmp_path / "with" / DRAFT_VOCAB_FILE).read_text())

    samples = TokenDataset(tmp_path / "data").samples
    counts = count_tokens((s.tokens[s.prompt_length:] for s in samples), AutoConfig.from_pretrained(target).vocab_size)
    assert listed["token_ids"] == choose_draft_vocab(counts)[0]  # the responses' tokens, not the prompts'
    assert load_drafter(tmp_path / "with").draft_vocab == sorted(listed["token_ids"])
    assert main([*common, "--out", str(tmp_path / "without"), "--no-draft-vocab"]) == 0
    assert not (tmp_path / "without" / DRAFT_VOCAB_FILE).exists()
    assert load_drafter(tmp_path / "without").draft_vocab is None


def test_make_models_publishes_the_list_with_the_drafter(tmp_path):
    from dflash_demo.build import publish_drafter

    run = tmp_path / "run"
    run.mkdir()
    for name in ("config.json", "model.safetensors"):
        (run / name).write_text(name)
    publish_drafter(run, tmp_path / "without")
    assert sorted(p.name for p in (tmp_path / "without").iterdir()) == ["config.json", "model.safetensors"]
    save_draft_vocab(run, [1, 2], 1.0, "hand")
    publish_drafter(run, tmp_path / "with")
    assert load_draft_vocab(tmp_path / "with") == [1, 2]


def test_save_pretrained_keeps_the_list_and_drops_a_stale_one(tmp_path):
    from dflash_core import load_drafter

    model = tiny_target("qwen3", vocab=64, layers=2, hidden=32, seed=0)
    drafter = tiny_drafter(drafter_config(model, layer_ids=(0,)))
    drafter.draft_vocab = [3, 9, 40]
    drafter.save_pretrained(tmp_path / "a")
    assert load_drafter(tmp_path / "a").draft_vocab == [3, 9, 40]
    load_drafter(tmp_path / "a").save_pretrained(tmp_path / "b")  # loaded and saved again: the list travels
    assert load_drafter(tmp_path / "b").draft_vocab == [3, 9, 40]
    assert not load_drafter(tmp_path / "a").sample_over_list  # absent from the file: sampled over all ids
    drafter.sample_over_list = True  # a drafter trained over its list: sampled drafts stay on it, after a reload too
    drafter.save_pretrained(tmp_path / "c")
    load_drafter(tmp_path / "c").save_pretrained(tmp_path / "d")
    assert load_drafter(tmp_path / "d").sample_over_list and load_drafter(tmp_path / "d").draft_vocab == [3, 9, 40]
    drafter.draft_vocab = None
    drafter.save_pretrained(tmp_path / "b")  # over a directory holding another drafter's list
    assert not (tmp_path / "b" / DRAFT_VOCAB_FILE).exists() and load_drafter(tmp_path / "b").draft_vocab is None
