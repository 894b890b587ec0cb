"""`dflash data` and `dflash train`: target-aligned data, the recipe, exact resume after a kill, DDP."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tiny import save_tiny_pair

from dflash_core import generate, load_drafter
from dflash_cli import main
from dflash_core.model.masks import block_attention_mask
from dflash_core.training.batches import make_batch, sample_index
from dflash_core.training.train_state import load_training_state
from dflash_core.training.data import TokenDataset

DFLASH = str(Path(sys.executable).parent / "dflash")
FAST = ["--dtype", "fp32", "--threads", "1"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    target, _ = save_tiny_pair(root)
    lines = Path(__file__).read_text().splitlines()
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": "\n".join(lines[i:i + 3])}) + "\n"
                               for i in range(0, 96, 2)))
    data = root / "data"
    assert main(["data", "--target", str(target), "--prompts", str(prompts), "--out", str(data),
                 "--max-new-tokens", "24", "--batch-size", "8", "--shard-size", "16", *FAST]) == 0
    return root, target, prompts, data


def _train(target, data, out, *extra):
    return main(["train", "--target", str(target), "--data", str(data), "--out", str(out), "--block-size", "4",
                 "--anchors", "6", "--batch-size", "3", "--no-progress", *FAST, *extra])


def test_data_set_holds_target_responses(setup):
    root, target, prompts, data = setup
    dataset = TokenDataset(data)
    index = json.loads((data / "index.json").read_text())
    assert len(dataset) == 48 == index["prompts_done"] and len(index["shards"]) == 3
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target)
    sample = dataset[5]
    prompt = torch.tensor(sample.tokens[: sample.prompt_length][None].astype("int64"))
    want = model.generate(prompt, max_new_tokens=24, do_sample=False, pad_token_id=0)[0].tolist()
    got = sample.tokens.tolist()
    assert got == want[: len(got)]  # the response IS the target's own greedy continuation


def test_data_resumes_after_a_kill(setup, tmp_path):
    root, target, prompts, data = setup
    out = tmp_path / "data"
    cmd = [DFLASH, "data", "--target", str(target), "--prompts", str(prompts), "--out", str(out),
           "--max-new-tokens", "24", "--batch-size", "2", "--shard-size", "2", *FAST]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    done_at_kill = _kill_when(proc, lambda: _json(out / "index.json").get("prompts_done", 0) >= 4)
    assert 0 < done_at_kill < 48, "the run must be interrupted part-way"
    assert main(cmd[1:]) == 0
    resumed, reference = TokenDataset(out), TokenDataset(data)
    assert len(resumed) == len(reference)
    assert all((a.tokens == b.tokens).all() for a, b in zip(resumed.samples, reference.samples))


def _json(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def _kill_when(proc, condition, timeout=240):
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if condition():
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.01)
    proc.kill()
    raise AssertionError("process ended before it could be killed part-way")


def test_bad_data_inputs(setup, tmp_path, capsys):
    root, target, prompts, data = setup
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert main(["data", "--target", str(target), "--prompts", str(empty), "--out", str(tmp_path / "x"), *FAST]) == 2
    assert "is empty" in capsys.readouterr().err
    # resuming a data set with other settings names the differing field
    assert main(["data", "--target", str(target), "--prompts", str(prompts), "--out", str(data),
                 "--max-new-tokens", "30", "--shard-size", "16", *FAST]) == 2
    assert "max_new_tokens differ" in capsys.readouterr().err
    # corrupt and missing shards
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in data.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    shard = broken / "shard-00001.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10] + b"0123456789")
    assert _train(target, broken, tmp_path / "d1", "--max-steps", "1") == 2
    assert "shard-00001.safetensors is corrupt" in capsys.readouterr().err
    shard.unlink()
    assert _train(target, broken, tmp_path / "d2", "--max-steps", "1") == 2
    err = capsys.readouterr().err
    assert "shard-00001.safetensors is missing" in err and len(err.strip().splitlines()) == 1


def test_batches_use_the_inference_mask(setup):
    """Training blocks see the context strictly before their anchor and only their own block."""
    _, _, _, data = setup
    dataset = TokenDataset(data)
    batch = make_batch(dataset, range(0, 2), anchors=3, block_size=4, max_length=512, seed=0)
    ctx = torch.arange(batch.tokens.shape[1]).expand(2, -1)
    mask = block_attention_mask(ctx, batch.valid, batch.anchors, 4)[:, 0]
    anchor = int(batch.anchors[0, 1])
    row = mask[0, 4]  # first query of block 1
    assert row[:anchor].all() and not row[anchor:ctx.shape[1]].any()
    assert row[ctx.shape[1] + 4: ctx.shape[1] + 8].all() and not row[ctx.shape[1]: ctx.shape[1] + 4].any()
    prompt_length = dataset[sample_index(0, len(dataset), 0)].prompt_length
    assert (batch.anchors[0][batch.anchor_valid[0]] >= prompt_length - 1).all()


def test_training_learns_and_outputs_a_published_drafter(setup, tmp_path):
    root, target, prompts, data = setup
    out = tmp_path / "drafter"
    assert _train(target, data, out, "--max-steps", "12", "--lr", "3e-3", "--eval-prompts", str(prompts),
                  "--eval-count", "2", "--eval-every", "6") == 0
    _, meta = load_training_state(out / "train_state")
    assert meta["step"] == 12 and meta["history"][-1] < meta["history"][0]
    assert [s for s, _ in meta["tau_history"]] == [6, 12, 12]
    drafter = load_drafter(out)  # published format, bf16 by default
    assert drafter.dtype == torch.bfloat16 and drafter.config.block_size == 4
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target)
    ids = torch.tensor([[5, 6, 7, 8]])
    result = generate(model, drafter.float(), ids, max_new_tokens=20)
    assert result.tokens[0] == model.generate(ids, max_new_tokens=20, do_sample=False, pad_token_id=0)[0, 4:].tolist()


def test_exact_resume_after_a_kill(setup, tmp_path):
    root, target, prompts, data = setup
    args = ["--max-steps", "8", "--checkpoint-every", "1", "--seed", "3"]
    assert _train(target, data, tmp_path / "straight", *args) == 0
    _, straight = load_training_state(tmp_path / "straight" / "train_state")
    out = tmp_path / "killed"
    cmd = [DFLASH, "train", "--target", str(target), "--data", str(data), "--out", str(out), "--block-size", "4",
           "--anchors", "6", "--batch-size", "3", "--no-progress", *FAST, *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _kill_when(proc, lambda: _json(out / "train_state" / "state.json").get("meta", {}).get("step", 0) >= 3)
    _, at_kill = load_training_state(out / "train_state")
    assert 3 <= at_kill["step"] < 8
    assert _train(target, data, out, *args) == 0
    _, resumed = load_training_state(out / "train_state")
    assert resumed["history"] == straight["history"]  # the same loss curve, bit for bit
    a, b = load_drafter(tmp_path / "straight"), load_drafter(out)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_resume_with_other_settings_is_refused(setup, tmp_path, capsys):
    root, target, prompts, data = setup
    out = tmp_path / "d"
    assert _train(target, data, out, "--max-steps", "2") == 0
    assert _train(target, data, out, "--max-steps", "4", "--anchors", "5", "--lr", "1e-3") == 2
    err = capsys.readouterr().err
    assert "differs in anchors, learning_rate" in err and (out / "config.json").is_file()
    assert _train(target, data, out, "--max-steps", "4") == 0  # more steps is a legal resume


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_two_cpu_processes_keep_identical_replicas(setup, tmp_path):
    root, target, prompts, data = setup
    out = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), "-m", "dflash_cli", "train", "--target", str(target),
           "--data", str(data), "--out", str(out), "--block-size", "4", "--anchors", "6", "--batch-size", "2",
           "--max-steps", "5", "--no-progress", *FAST]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads([line for line in done.stderr.splitlines() if line.startswith("{")][-1])
    assert summary["replicas_identical"] is True and summary["steps"] == 5
    _, meta = load_training_state(out / "train_state")
    assert meta["world_size"] == 2 and len(meta["history"]) == 5


@pytest.mark.parametrize("extra,pattern", [
    (["--target-layer-ids", "1,9"], r"expected ids within \[0, 4\) for a 4-layer target"),
    (["--target-layer-ids", "1,x"], r"--target-layer-ids is '1,x', expected comma-separated integers"),
    (["--block-size", "1"], r"--block-size: got '1', expected an integer >= 2"),
    (["--anchors", "0"], r"--anchors: got '0', expected an integer >= 1"),
])
def test_bad_training_settings(setup, tmp_path, capsys, extra, pattern):
    import re

    _, target, _, data = setup
    assert _train(target, data, tmp_path / "d", "--max-steps", "1", *extra) == 2
    err = capsys.readouterr().err
    assert re.search(pattern, err), err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "d").exists()


def test_training_blocks_equal_inference_drafts(setup):
    """Many blocks in one training pass give exactly what the decoder computes for each block alone."""
    from tiny import drafter_config, tiny_drafter, tiny_target

    from dflash_core import TargetModel
    from dflash_core.training.batches import Batch
    from dflash_core.training.objective import block_hidden

    model = tiny_target(vocab=32, layers=4, seed=3)
    drafter = tiny_drafter(drafter_config(model, layers=2, block_size=6, layer_ids=(1, 2)), seed=3)
    target = TargetModel(model, drafter.config.target_layer_ids)
    tokens = torch.randint(0, 30, (2, 40), generator=torch.Generator().manual_seed(0))
    valid = torch.ones_like(tokens, dtype=torch.bool)
    valid[1, 33:] = False  # a padded row
    anchors = torch.tensor([[5, 6, 20, 33], [0, 12, 13, 30]])
    batch = Batch(tokens, valid, anchors, torch.ones_like(anchors, dtype=torch.bool), tokens[:, :5].clone()[:, None].expand(2, 4, 5), torch.ones(2, 4, 5, dtype=torch.bool))
    with torch.no_grad():
        features = target(tokens, torch.arange(40).expand(2, -1), None, valid.long()).features
        trained = block_hidden(drafter, target, features, batch)  # [2, 4, 6, H]
        for row in range(2):
            for j, anchor in enumerate(anchors[row].tolist()):
                cache = drafter.new_cache(1, 64)
                if anchor:
                    drafter.extend_cache(cache, features[row:row + 1, :anchor], torch.arange(anchor)[None], [anchor])
                ids = torch.full((1, 6), drafter.config.mask_token_id)
                ids[0, 0] = tokens[row, anchor]
                alone = drafter.draft_with_cache(cache, target.embed(ids), anchor + torch.arange(6)[None])
                assert (trained[row, j] - alone[0]).abs().max().item() <= 1e-5, (row, anchor)


def test_tokens_per_step_is_the_harmonic_mean_over_valid_anchors():
    """Hand-computed: anchors committing 16, 1, 1 and 2 tokens (one invalid) -> 4 / (1/16 + 1 + 1 + 1/2)."""
    from dflash_core.training.objective import tokens_per_step

    committed = torch.tensor([[16, 1, 7], [1, 2, 9]])
    valid = torch.tensor([[True, True, False], [True, True, False]])
    assert tokens_per_step(committed, valid) == pytest.approx(4 / (1 / 16 + 1 + 1 + 1 / 2))
    # a loop committing whole blocks does not drown three anchors that commit one token each
    assert tokens_per_step(torch.tensor([[16, 1, 1, 1]]), torch.ones(1, 4, dtype=torch.bool)) < 1.5
