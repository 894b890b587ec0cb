"""The recipe levers of `dflash train`: soft labels, feature layers, init from the target or a drafter.

Each lever: its math pinned on a hand-sized case, its setting kept in the training state (a resume
with another value is refused), its output a published-format drafter that loads back exactly and
still decodes losslessly (greedy == the target alone).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny import save_tiny_pair, tiny_target

from dflash_cli import main
from dflash_core import TargetModel, generate, load_drafter
from dflash_core.model.drafter import Drafter
from dflash_core.errors import CompatibilityError, ConfigError
from dflash_core.training.batches import Batch
from dflash_core.training.data import TokenDataset
from dflash_core.training.init_from_target import _mismatch, init_from_target
from dflash_core.training.objective import block_loss, soft_label_kl, teacher_hidden_at_labels, teacher_kl
from dflash_core.training.recipe import TrainConfig, drafter_config_for, feature_layer_ids
from dflash_core.training.train_state import load_training_state

FAST = ["--dtype", "fp32", "--threads", "1"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A 6-layer tiny target (the demo target's depth) and a small target-made data set."""
    root = tmp_path_factory.mktemp("levers")
    target, _ = save_tiny_pair(root, target_layers=6)
    lines = Path(__file__).read_text().splitlines()
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": "\n".join(lines[i:i + 3])}) + "\n" for i in range(0, 32, 2)))
    data = root / "data"
    assert main(["data", "--target", str(target), "--prompts", str(prompts), "--out", str(data),
                 "--max-new-tokens", "24", "--batch-size", "8", "--shard-size", "16", *FAST]) == 0
    return target, data


def _train(target, data, out, *extra):
    return main(["train", "--target", str(target), "--data", str(data), "--out", str(out), "--block-size", "4",
                 "--anchors", "6", "--batch-size", "3", "--max-steps", "2", "--save-dtype", "fp32",
                 "--no-progress", *FAST, *extra])


# ---- soft labels: the math by hand ------------------------------------------------------------------


def _one_block(labels, valid=(True, True)) -> Batch:
    """One sequence, one block of size 3 anchored at 0: label positions 1 and 2."""
    return Batch(tokens=torch.zeros(1, 4, dtype=torch.long), valid=torch.ones(1, 4, dtype=torch.bool),
                 anchors=torch.zeros(1, 1, dtype=torch.long), anchor_valid=torch.ones(1, 1, dtype=torch.bool),
                 labels=torch.tensor([[labels]]), label_valid=torch.tensor([[list(valid)]]))


def test_soft_label_loss_equals_a_hand_computed_value():
    # 2 positions, vocabulary 3; logits are log-probabilities, so the distributions are exact
    student = torch.log(torch.tensor([[[[1 / 3, 1 / 3, 1 / 3], [0.50, 0.25, 0.25]]]]))  # [1, 1, 2, 3]
    teacher = torch.log(torch.tensor([[[[0.50, 0.25, 0.25], [0.25, 0.25, 0.50]]]]))
    # KL(p||q) = sum p log(p/q):
    #   position 1: 0.5 ln(0.5/(1/3)) + 2 * 0.25 ln(0.25/(1/3)) = 0.5 ln 1.5 + 0.5 ln 0.75 = 0.5 ln 1.125
    #   position 2: 0.25 ln(0.25/0.5) + 0.25 ln 1 + 0.5 ln(0.5/0.25) = 0.25 ln 2
    # gamma 1: weights w1 = 1, w2 = e^-1; the loss is the weighted mean
    kl1, kl2 = 0.5 * math.log(1.125), 0.25 * math.log(2.0)
    soft_by_hand = (kl1 + math.exp(-1) * kl2) / (1 + math.exp(-1))  # 0.089657...
    assert soft_by_hand == pytest.approx(0.0896573, abs=1e-6)
    batch = _one_block([0, 2])
    soft = soft_label_kl(student, teacher, 1.0)
    assert soft[0, 0].tolist() == pytest.approx([kl1, kl2], abs=1e-6)
    loss, _ = block_loss(student, batch, 1.0, soft, soft_weight=1.0)
    assert loss.item() == pytest.approx(soft_by_hand, abs=1e-6)
    # mix W = 0.25: the hard term is the cross entropy of labels 0 and 2: ln 3 and ln 4
    hard_by_hand = (math.log(3.0) + math.exp(-1) * math.log(4.0)) / (1 + math.exp(-1))
    loss, _ = block_loss(student, batch, 1.0, soft, soft_weight=0.25)
    assert loss.item() == pytest.approx(0.75 * hard_by_hand + 0.25 * soft_by_hand, abs=1e-6)
    assert block_loss(student, batch, 1.0)[0].item() == pytest.approx(hard_by_hand, abs=1e-6)
    # a masked position drops out of the mean
    loss, _ = block_loss(student, _one_block([0, 2], (True, False)), 1.0, soft, soft_weight=1.0)
    assert loss.item() == pytest.approx(kl1, abs=1e-6)
    # the chunked teacher path (LM head over hidden states) gives the same term; T^2 scales it
    head = torch.nn.Linear(3, 3, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.eye(3))
    assert torch.allclose(teacher_kl(student, teacher, head, 1.0, chunk=1), soft, atol=1e-6)
    t = 2.0
    p, q = torch.softmax(teacher / t, -1), torch.softmax(student / t, -1)
    assert torch.allclose(teacher_kl(student, teacher, head, t), t * t * (p * (p / q).log()).sum(-1), atol=1e-6)


def test_soft_labels_read_the_target_state_before_each_label():
    """Label k of the block at anchor a is predicted from the target's hidden state at a + k - 1."""
    hidden = torch.arange(10.0)[None, :, None].expand(1, 10, 2)  # position p holds the value p
    batch = Batch(tokens=torch.zeros(1, 10, dtype=torch.long), valid=torch.ones(1, 10, dtype=torch.bool),
                  anchors=torch.tensor([[2, 7]]), anchor_valid=torch.ones(1, 2, dtype=torch.bool),
                  labels=torch.zeros(1, 2, 3, dtype=torch.long), label_valid=torch.ones(1, 2, 3, dtype=torch.bool))
    got = teacher_hidden_at_labels(hidden, batch)[0, :, :, 0]
    assert got.tolist() == [[2.0, 3.0, 4.0], [7.0, 8.0, 9.0]]


# ---- feature layers and init from the target --------------------------------------------------------


def test_feature_layer_ids_follow_the_reference_rule():
    assert feature_layer_ids(6, 1, None) == (3,) and feature_layer_ids(6, 2, None) == (1, 3)
    assert feature_layer_ids(6, 3, 1) == (3,)  # independent of the draft depth
    assert feature_layer_ids(6, 1, 3) == (1, 2, 3)
    assert feature_layer_ids(6, 1, 6) == (0, 1, 2, 3, 4, 5)
    with pytest.raises(ConfigError, match="holds only 3 distinct layers"):
        feature_layer_ids(6, 1, 5)
    with pytest.raises(ConfigError, match="expected at most 6"):
        feature_layer_ids(6, 1, 7)
    with pytest.raises(ConfigError, match="one or the other"):
        TrainConfig(feature_layers=2, target_layer_ids=(1, 2))


def test_settings_of_older_runs_count_as_defaults():
    """A state saved before the levers existed resumes (its run had today's defaults)."""
    saved = {k: v for k, v in TrainConfig().to_dict().items()
             if k not in ("distill", "distill_weight", "distill_temperature", "feature_layers", "init_from_target")}
    assert TrainConfig().differences(saved) == []
    assert TrainConfig(distill="soft").differences(saved) == ["distill"]


def test_init_from_compares_as_the_folder_it_names(tmp_path, monkeypatch):
    """`make models --work runs/demo` resumed as `--work ./runs/demo` (or absolute) is the same run."""
    monkeypatch.chdir(tmp_path)
    saved = TrainConfig(init_from="runs/demo/drafter_run").to_dict()
    for spelling in ("./runs/demo/drafter_run", str(tmp_path / "runs/demo/drafter_run"), "runs/demo/../demo/drafter_run"):
        assert TrainConfig(init_from=spelling).differences(saved) == []
    assert TrainConfig(init_from="runs/demo/greedy_run").differences(saved) == ["init_from"]
    assert TrainConfig().differences(saved) == ["init_from"]


def test_init_from_target_copies_the_last_layers():
    model = tiny_target(vocab=64, layers=6, seed=1)
    target = TargetModel(model)
    drafter = Drafter(drafter_config_for(target, 63, TrainConfig(draft_layers=2)))
    drafter.reset_parameters(0.02, torch.Generator().manual_seed(0))
    fc = drafter.fc.weight.clone()
    assert init_from_target(drafter, target) == [4, 5]
    for draft_layer, index in zip(drafter.layers, (4, 5)):
        theirs = dict(model.model.layers[index].named_parameters())
        assert all(torch.equal(p, theirs[name]) for name, p in draft_layer.named_parameters())
    assert torch.equal(drafter.norm.weight, model.model.norm.weight) and torch.equal(drafter.fc.weight, fc)
    biased = TargetModel(tiny_target("llama", vocab=64, layers=6, attention_bias=True))
    other = Drafter(drafter_config_for(biased, 63, TrainConfig()))
    with pytest.raises(CompatibilityError, match=r"target layer 5 \(LlamaDecoderLayer\) has self_attn.k_proj.bias, "
                                                 r"which a drafter layer has no place for"):
        init_from_target(other, biased)
    with pytest.raises(ConfigError, match="at most 6 draft layers"):
        init_from_target(Drafter(drafter_config_for(target, 63, TrainConfig(draft_layers=7))), target)


def test_init_from_target_copies_llama_layers_and_still_decodes_losslessly():
    """Llama layers lack the per-head q/k norms: those are set to unit weight, everything else is copied."""
    model = tiny_target("llama", vocab=64, layers=6, seed=2)
    target = TargetModel(model)
    drafter = Drafter(drafter_config_for(target, 63, TrainConfig(draft_layers=2)))
    drafter.reset_parameters(0.02, torch.Generator().manual_seed(0))
    with torch.no_grad():  # not the fresh unit weights: init_from_target itself must set them
        for layer in drafter.layers:
            layer.self_attn.q_norm.weight.fill_(0.5)
            layer.self_attn.k_norm.weight.fill_(0.5)
    assert init_from_target(drafter, target) == [4, 5]
    for draft_layer, index in zip(drafter.layers, (4, 5)):
        theirs = dict(model.model.layers[index].named_parameters())
        for name, param in draft_layer.named_parameters():
            assert torch.equal(param, theirs[name] if name in theirs else torch.ones_like(param)), name
    assert torch.equal(drafter.norm.weight, model.model.norm.weight)
    mine = dict(drafter.layers[0].named_parameters())
    half = {k: v for k, v in mine.items() if k != "self_attn.k_norm.weight"}  # one per-head norm, not its pair
    assert _mismatch(mine, half) == ("lacks self_attn.k_norm.weight but has its pair "
                                     "(one per-head norm without the other)")
    prompt = torch.tensor([[5, 9, 2, 33, 17, 8]])
    want = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24, do_sample=False,
                          pad_token_id=0)[0, prompt.shape[1]:].tolist()
    assert generate(model, drafter, prompt, max_new_tokens=24).tokens[0] == want


# ---- each lever end to end: state, published format, lossless decoding ------------------------------

LEVERS = {
    # name: (flags, setting in the state, resume flags that must be refused, field named, feature ids)
    "soft": (["--distill", "soft"], {"distill": "soft"}, ["--distill", "mix"], "distill", (3,)),
    "mix": (["--distill", "mix", "--distill-weight", "0.3", "--distill-temperature", "2"],
            {"distill": "mix", "distill_weight": 0.3, "distill_temperature": 2.0},
            ["--distill", "mix", "--distill-weight", "0.3"], "distill_temperature", (3,)),
    "features-3": (["--feature-layers", "3"], {"feature_layers": 3}, ["--feature-layers", "1"], "feature_layers",
                   (1, 2, 3)),
    "features-all": (["--feature-layers", "6", "--layers", "2"], {"feature_layers": 6}, ["--layers", "2"],
                     "feature_layers", (0, 1, 2, 3, 4, 5)),
    "init": (["--init-from-target", "--layers", "2"], {"init_from_target": True}, ["--layers", "2"],
             "init_from_target", (1, 3)),
    "loss-over-list": (["--loss-vocab", "list"], {"loss_vocab": "list"}, ["--loss-vocab", "full"], "loss_vocab", (3,)),
    "narrow-mlp": (["--intermediate-size", "24"], {"intermediate_size": 24}, ["--intermediate-size", "40"],
                   "intermediate_size", (3,)),
}


@pytest.mark.parametrize("lever", sorted(LEVERS))
def test_lever_round_trips_and_decodes_losslessly(setup, tmp_path, capsys, lever):
    target, data = setup
    flags, settings, changed, field, ids = LEVERS[lever]
    out = tmp_path / "drafter"
    assert _train(target, data, out, *flags) == 0
    weights, meta = load_training_state(out / "train_state")
    assert meta["step"] == 2 and all(meta["train"][k] == v for k, v in settings.items())
    assert meta["history"][0] > 0 and all(math.isfinite(x) for x in meta["history"])
    drafter = load_drafter(out)  # the published format, written in fp32 here
    assert drafter.config.target_layer_ids == ids and drafter.fc.weight.shape[1] == len(ids) * 32
    assert json.loads((out / "config.json").read_text())["dflash_config"]["target_layer_ids"] == list(ids)
    published = load_file(str(out / "model.safetensors"))
    assert published.keys() == weights.keys() and all(torch.equal(published[k], weights[k]) for k in weights)
    # the setting is part of the run: resuming with another value is refused, naming it
    assert _train(target, data, out, "--max-steps", "3", *changed) == 2
    assert re.search(rf"differs in [a-z_, ]*\b{field}\b", capsys.readouterr().err)
    # greedy speculative decoding with the trained drafter == the target alone
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target)
    sample = TokenDataset(data)[3]
    ids_in = torch.from_numpy(sample.tokens[: sample.prompt_length].astype("int64"))[None]
    want = model.generate(ids_in, attention_mask=torch.ones_like(ids_in), max_new_tokens=20, do_sample=False,
                          pad_token_id=0)[0, ids_in.shape[1]:].tolist()
    assert generate(model, drafter, ids_in, max_new_tokens=20).tokens[0] == want
    # sampled drafts stay on the read-out list exactly when the loss ran over it (draft_vocab.json says so)
    assert drafter.sample_over_list == (lever == "loss-over-list") and drafter.draft_vocab
    # the draft MLP is the target's width unless narrowed (the tiny target's is 64)
    assert drafter.layers[0].mlp.down_proj.weight.shape[1] == (24 if lever == "narrow-mlp" else 64)
    if lever == "init":  # two small steps from the target's last two layers, not from random weights
        for draft_layer, index in zip(drafter.layers, (4, 5)):
            source = model.model.layers[index].mlp.down_proj.weight
            assert (draft_layer.mlp.down_proj.weight - source).abs().max() < 0.02 < source.abs().max()


def test_init_from_continues_a_trained_drafter_and_refuses_another_shape(setup, tmp_path, capsys):
    target, data = setup
    first, second, fresh = tmp_path / "first", tmp_path / "second", tmp_path / "fresh"
    assert _train(target, data, first) == 0
    files = {f.name: f.read_bytes() for f in first.rglob("*") if f.is_file()}
    tiny_steps = ["--lr", "1e-9"]  # two steps that barely move the weights: where they start shows
    assert _train(target, data, second, "--init-from", str(first), *tiny_steps) == 0
    assert _train(target, data, fresh, *tiny_steps, "--seed", "1") == 0
    start, continued, new = (load_drafter(d).state_dict() for d in (first, second, fresh))
    assert all((continued[k] - v).abs().max() < 1e-6 for k, v in start.items())
    assert any((new[k] - v).abs().max() > 1e-2 for k, v in start.items())
    assert {f.name: f.read_bytes() for f in first.rglob("*") if f.is_file()} == files  # the input is untouched
    _, meta = load_training_state(second / "train_state")
    assert meta["train"]["init_from"] == str(first)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target)
    ids_in = torch.tensor([[5, 9, 11, 3, 7]])
    want = model.generate(ids_in, attention_mask=torch.ones_like(ids_in), max_new_tokens=16, do_sample=False,
                          pad_token_id=0)[0, 5:].tolist()
    assert generate(model, load_drafter(second), ids_in, max_new_tokens=16).tokens[0] == want
    # another shape is refused, naming what differs; nothing is written
    capsys.readouterr()
    assert _train(target, data, tmp_path / "bad", "--init-from", str(first), "--layers", "2") == 2
    err = capsys.readouterr().err
    assert "num_hidden_layers (1 there, 2 here)" in err and len(err.strip().splitlines()) == 1, err
    assert _train(target, data, tmp_path / "bad", "--init-from", str(first), "--init-from-target") == 2
    assert "one starting point or the other" in capsys.readouterr().err
    assert _train(target, data, tmp_path / "bad", "--init-from", str(tmp_path / "none")) == 2
    assert not (tmp_path / "bad").exists()


def test_several_data_directories_train_as_one_joined_set(setup, tmp_path, capsys):
    """`--data A --data B`: the samples of both, in order (the read-out list counts both), and the run's data
    fingerprint covers both: resuming with A alone is refused, naming the data."""
    from dflash_core.training.trainer import data_fingerprint, load_data

    target, data = setup
    second = tmp_path / "second"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"def f{i}(x):\n    return x * {i}"}) + "\n" for i in range(6)))
    assert main(["data", "--target", str(target), "--prompts", str(prompts), "--out", str(second),
                 "--max-new-tokens", "12", "--batch-size", "3", "--shard-size", "4", *FAST]) == 0
    first, other, both = TokenDataset(data), TokenDataset(second), load_data([data, second])
    assert len(both) == len(first) + len(other) == len(first) + 6
    assert all((a.tokens == b.tokens).all() and a.prompt_length == b.prompt_length
               for a, b in zip(both.samples, first.samples + other.samples, strict=True))
    assert data_fingerprint(both) not in (data_fingerprint(first), data_fingerprint(other))
    out = tmp_path / "drafter"
    assert _train(target, data, out, "--data", str(second)) == 0
    _, meta = load_training_state(out / "train_state")
    assert meta["data"] == data_fingerprint(both)
    source = json.loads((out / "draft_vocab.json").read_text())["source"]
    assert str(data) in source and str(second) in source
    assert _train(target, data, out, "--max-steps", "3") == 2
    assert re.search(r"differs in [a-z_, ]*\bdata\b", capsys.readouterr().err)


@pytest.mark.parametrize("extra,pattern", [
    (["--distill", "kl"], r"--distill: got 'kl', expected one of hard, soft, mix"),
    (["--distill-weight", "1.5"], r"--distill-weight: got '1.5', expected a finite number >= 0 and <= 1"),
    (["--distill-temperature", "0"], r"--distill-temperature: got '0', expected a finite number > 0"),
    (["--feature-layers", "0"], r"--feature-layers: got '0', expected an integer >= 1"),
    (["--feature-layers", "2", "--target-layer-ids", "1,2"], r"--target-layer-ids: not allowed with argument"),
    (["--feature-layers", "5"], r"feature_layers is 5 but the reference spacing .* holds only 3 distinct layers"),
    (["--loss-vocab", "vocab"], r"--loss-vocab: got 'vocab', expected one of full, list"),
    (["--intermediate-size", "0"], r"--intermediate-size: got '0', expected an integer >= 1"),
    (["--intermediate-size", "16", "--init-from-target"], r"'intermediate_size' is 16, expected unset with init_from"),
    (["--loss-vocab", "list", "--no-draft-vocab"], r"--loss-vocab list needs the read-out list that --no-draft-vocab"),
])
def test_bad_lever_settings(setup, tmp_path, capsys, extra, pattern):
    target, data = setup
    assert _train(target, data, tmp_path / "d", *extra) == 2
    err = capsys.readouterr().err
    assert re.search(pattern, err), err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "d").exists()


# ---- anchors: blocks grouped for a cost linear in the anchor count ----------------------------------


@pytest.mark.parametrize("group", [1, 3])
def test_grouped_blocks_equal_one_attention_over_all_blocks(group):
    """Blocks attended in groups (folded into the batch) == the single masked pass over all blocks."""
    from tiny import drafter_config, tiny_drafter

    from dflash_core.training.objective import block_hidden

    model = tiny_target(vocab=32, layers=4, seed=3)
    config = drafter_config(model, layers=2, block_size=6, layer_ids=(1, 2),
                            layer_types=("full_attention", "sliding_attention"), sliding_window=9)
    drafter = tiny_drafter(config, seed=3)
    target = TargetModel(model, drafter.config.target_layer_ids)
    tokens = torch.randint(0, 30, (2, 40), generator=torch.Generator().manual_seed(0))
    valid = torch.ones_like(tokens, dtype=torch.bool)
    valid[1, 33:] = False  # a padded row
    anchors = torch.tensor([[5, 6, 20, 33], [0, 12, 13, 30]])
    batch = Batch(tokens, valid, anchors, torch.ones_like(anchors, dtype=torch.bool),
                  torch.zeros(2, 4, 5, dtype=torch.long), torch.ones(2, 4, 5, dtype=torch.bool))
    with torch.no_grad():
        features = target(tokens, torch.arange(40).expand(2, -1), None, valid.long()).features
    results = []
    for g in (None, group):
        hidden = block_hidden(drafter, target, features, batch, g)
        hidden.square().sum().backward()
        results.append((hidden.detach(), [p.grad.clone() for p in drafter.parameters()]))
        drafter.zero_grad(set_to_none=True)
    (ref, ref_grads), (got, got_grads) = results
    assert got.shape == ref.shape == (2, 4, 6, 32) and (got - ref).abs().max().item() <= 1e-5
    for a, b in zip(got_grads, ref_grads):  # another summation order: equal up to fp32 rounding of the sums
        assert (a - b).abs().max().item() <= 1e-5 * max(1.0, b.abs().max().item())


# ---- precision: --dtype auto picks bf16 only where this machine runs it faster -----------------------


@pytest.mark.parametrize("batch, probed", [(8, "train"), (2, "decode")])
def test_data_in_batches_takes_the_batch_probes_precision(setup, tmp_path, capsys, monkeypatch, batch, probed):
    """`dflash data --dtype auto` answers >= BATCHED_ROWS prompts together with the precision of the batch
    ("train") probe and fewer with the decode probe's; the two verdicts are seeded opposite in the cache (the
    wiring is under test, not the clock), so the precision named shows which probe was read."""
    from dflash_core.tuning.auto_dtype import BATCHED_ROWS, resolve_auto_dtype
    from dflash_core.loading import load_target

    assert BATCHED_ROWS == 8
    target, _ = setup
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path / "cache"))
    decode = {n: {"dtype": n, "one_token_s": 0.01, "block_s": 0.02} for n in ("fp32",)} | {
        "bf16": {"dtype": "bf16", "one_token_s": 0.02, "block_s": 0.05}}  # decode: fp32
    train = {"fp32": {"dtype": "fp32", "train_s": 1.0, "tokens": 512},
             "bf16": {"dtype": "bf16", "train_s": 0.5, "tokens": 512}}  # batches: bf16
    model = load_target(target, (), "fp32").model
    for workload, costs in (("decode", decode), ("train", train)):
        resolve_auto_dtype(model, 16, device="cpu", workload=workload, cache_dir=tmp_path / "cache",
                           probe=lambda m, dtype, b, costs=costs: costs["fp32" if dtype == torch.float32 else "bf16"])
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"def f{i}(x):"}) + "\n" for i in range(batch)))
    assert main(["data", "--target", str(target), "--prompts", str(prompts), "--out", str(tmp_path / "data"),
                 "--max-new-tokens", "4", "--batch-size", str(batch), "--dtype", "auto", "--threads", "1"]) == 0
    err = capsys.readouterr().err
    want = r"^dtype bf16 for batches: .*\(cached\)$" if probed == "train" else r"^dtype fp32: bf16 is .*\(cached\)$"
    assert re.search(want, err, re.M), err


@pytest.mark.parametrize("bf16_faster", [False, True])
def test_auto_dtype_sets_the_training_precision(setup, tmp_path, capsys, monkeypatch, bf16_faster):
    """The training probe's verdict (seeded in the cache here: this test is about the wiring, not the clock)
    decides both the target's dtype and bf16 autocast; a run resumed under the other verdict continues. The
    decode probe's verdict, seeded the other way, is not what training reads."""
    from dflash_core.tuning.auto_dtype import resolve_auto_dtype
    from dflash_core.loading import load_target

    target, data = setup
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path / "cache"))
    fp32, bf16 = (0.01, 0.02), ((0.012, 0.078) if bf16_faster else (0.006, 0.011))  # decode: the other way
    decode = {n: {"dtype": n, "one_token_s": one, "block_s": blk, "block_size": 4}
              for n, (one, blk) in (("fp32", fp32), ("bf16", bf16))}
    train = {"fp32": {"dtype": "fp32", "train_s": 1.0, "tokens": 512},
             "bf16": {"dtype": "bf16", "train_s": 0.6 if bf16_faster else 1.3, "tokens": 512}}
    model = load_target(target, (), "fp32").model  # the cache key is the model's config, as the CLI loads it
    for workload, costs in (("decode", decode), ("train", train)):
        resolve_auto_dtype(model, 4, device="cpu", workload=workload, cache_dir=tmp_path / "cache",
                           probe=lambda m, dtype, b, costs=costs: costs["fp32" if dtype == torch.float32 else "bf16"])
    out = tmp_path / "run"
    args = [a for a in FAST if a not in ("--dtype", "fp32")] + ["--dtype", "auto"]
    assert main(["train", "--target", str(target), "--data", str(data), "--out", str(out), "--block-size", "4",
                 "--anchors", "6", "--batch-size", "3", "--max-steps", "1", "--save-dtype", "fp32",
                 "--no-progress", *args]) == 0
    err = capsys.readouterr().err
    chosen = "bf16" if bf16_faster else "fp32"
    assert re.search(rf"^dtype {chosen} for batches\b.*\(cached\)$", err, re.M), err
    _, meta = load_training_state(out / "train_state")
    assert meta["train"]["bf16"] is bf16_faster
    # the same run resumed in the other precision (another machine) is continued, not refused
    other = FAST if bf16_faster else [a if a != "fp32" else "bf16" for a in FAST]
    assert main(["train", "--target", str(target), "--data", str(data), "--out", str(out), "--block-size", "4",
                 "--anchors", "6", "--batch-size", "3", "--max-steps", "2", "--save-dtype", "fp32",
                 "--no-progress", *other]) == 0
    assert load_training_state(out / "train_state")[1]["step"] == 2
