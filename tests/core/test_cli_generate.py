"""`dflash generate` end to end on a tiny model saved to disk."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tiny import save_tiny_pair

from dflash_cli import main


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("pair"))


def _run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_with_compare_ar(pair, capsys):
    target, drafter = pair
    code, out, err = _run(capsys, "generate", "--target", str(target), "--drafter", str(drafter), "--prompt",
                          "def main(", "--max-new-tokens", "24", "--dtype", "fp32", "--compare-ar", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert set(report) >= {"text", "tokens", "tau", "acceptance_lengths", "tokens_per_s", "ar_tokens_per_s",
                           "speedup", "matches_ar"}
    assert report["matches_ar"] is True
    assert 0 < len(report["tokens"]) <= 24 and report["tau"] >= 1
    assert sum(report["acceptance_lengths"]) + 1 == len(report["tokens"])


def test_stream_prints_the_same_text(pair, capsys):
    target, drafter = pair
    args = ["generate", "--target", str(target), "--drafter", str(drafter), "--prompt", "import os\n",
            "--max-new-tokens", "20", "--dtype", "fp32"]
    code, streamed, _ = _run(capsys, *args, "--stream")
    assert code == 0
    code, _, _ = _run(capsys, *args, "--json")
    code, out, _ = _run(capsys, *args, "--json")
    assert streamed.rstrip("\n") == json.loads(out)["text"]



def test_drafter_weights_flag_is_passed_on_and_checked(pair, capsys):
    target, drafter = pair
    args = ["generate", "--target", str(target), "--drafter", str(drafter), "--prompt", "def main(",
            "--max-new-tokens", "16", "--dtype", "fp32", "--compare-ar", "--json"]
    outputs = {}
    for weights in ("plain", "fp16-packed", "bf16"):
        code, out, err = _run(capsys, *args, "--drafter-weights", weights)
        if code != 0 and "need an fp32 drafter on a CPU" in err:  # no FBGEMM fp16 kernel / no bf16 in hardware
            continue
        assert code == 0, err
        report = json.loads(out)
        assert report["matches_ar"] is True, weights
        outputs[weights] = report["tokens"]
        assert ("note: drafter weights fp16-packed" in err) == (weights == "fp16-packed"), err
        assert ("note: drafter weights bf16 copies" in err) == (weights == "bf16"), err
    assert len(set(map(tuple, outputs.values()))) == 1  # lossless either way: the target's own tokens
    code, _, err = _run(capsys, *args, "--drafter-weights", "int8")
    assert code == 2 and "argument --drafter-weights: invalid choice: 'int8'" in err

@pytest.mark.parametrize("tree", ["auto", "5"])
def test_token_tree_flag_is_lossless(pair, capsys, tree):
    target, drafter = pair
    code, out, err = _run(capsys, "generate", "--target", str(target), "--drafter", str(drafter), "--prompt",
                          "def main(", "--max-new-tokens", "24", "--dtype", "fp32", "--compare-ar", "--json",
                          "--tree", tree)
    assert code == 0, err
    assert json.loads(out)["matches_ar"] is True


def test_sampling_and_bf16(pair, capsys):
    target, drafter = pair
    code, out, err = _run(capsys, "generate", "--target", str(target), "--drafter", str(drafter), "--prompt", "x = ",
                          "--max-new-tokens", "16", "--temperature", "0.8", "--top-p", "0.9", "--top-k", "20",
                          "--seed", "1", "--json", "--compare-ar")
    assert code == 0, err
    report = json.loads(out)
    assert report["matches_ar"] is None and len(report["tokens"]) <= 16


@pytest.mark.parametrize("extra,pattern", [
    (["--prompt", "   "], "the prompt is empty"),
    (["--prompt", "x", "--max-new-tokens", "0"], "--max-new-tokens: got '0', expected an integer >= 1"),
    (["--prompt", "x", "--temperature", "-1"], "--temperature: got '-1', expected a finite number >= 0"),
    (["--prompt", "x", "--top-p", "1.5"], r"--top-p: got '1.5', expected a finite number > 0 and <= 1"),
    (["--prompt", "x", "--max-new-tokens", "5000"], "beyond the target's 512 positions"),
    (["--prompt-file", "/nonexistent/prompt.txt"], "does not exist"),
    (["--prompt", "x", "--tree", "0"], r"--tree: got '0', expected auto, off or a node count in \[1, 64\]"),
    (["--prompt", "x", "--tree", "wide"], r"--tree: got 'wide', expected auto, off or a node count"),
])
def test_bad_input_exits_2_with_one_line(pair, capsys, extra, pattern):
    import re

    target, drafter = pair
    code, out, err = _run(capsys, "generate", "--target", str(target), "--drafter", str(drafter), *extra)
    assert code == 2
    assert re.search(pattern, err), err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_mismatched_drafter_is_refused(tmp_path, capsys):
    target, _ = save_tiny_pair(tmp_path / "a")
    other = tmp_path / "b"
    from tiny import drafter_config, tiny_drafter

    tiny_drafter(drafter_config(hidden=48, heads=4, target_layers=4, vocab=300)).save_pretrained(other)
    code, _, err = _run(capsys, "generate", "--target", str(target), "--drafter", str(other), "--prompt", "x")
    assert code == 2 and "hidden_size is 48 but the target's is 32" in err


def test_console_script_runs(pair):
    """The installed `dflash` entry point, as a user runs it."""
    target, drafter = pair
    exe = [str(Path(sys.executable).parent / "dflash")]
    done = subprocess.run([*exe, "generate", "--target", str(target), "--drafter", str(drafter),
                           "--prompt", "class A:", "--max-new-tokens", "8", "--json", "--dtype", "fp32",
                           "--threads", "1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["tokens"]) <= 8
    bad = subprocess.run([*exe, "generate", "--target", str(target), "--drafter", "/nope", "--prompt", "x"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "/nope" in bad.stderr


def test_demo_streams_and_measures_side_by_side(tmp_path, capsys):
    """`dflash demo` (what `make demo` runs) on a tiny pair: streamed text, then per-prompt and summary lines."""
    save_tiny_pair(tmp_path)
    prompts = ["def main(", "import os\n", "x = ["]
    (tmp_path / "heldout.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    code, out, err = _run(capsys, "demo", "--models", str(tmp_path), "--prompt-index", "1", "--max-new-tokens", "24",
                          "--dtype", "fp32", "--summary-prompts", "3")
    assert code == 0, err
    assert out.startswith("import os\n")
    assert "this prompt: " in err and "identical to target alone: yes" in err
    assert "3 held-out prompts: tau" in err and "identical to target alone: 3/3" in err
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    assert all(line.startswith("note: drafter weights ") for line in notes), notes  # fp32: no dtype to explain


CHAT_TEMPLATE = ("{% for m in messages %}{{ '<|endoftext|>' + m['role'] + '\n' + m['content'] + '<|MASK|>' + '\n' }}"
                 "{% endfor %}{% if add_generation_prompt %}{{ '<|endoftext|>assistant\n' }}{% endif %}")


def test_demo_streams_a_chat_reply(tmp_path, capsys):
    """A chat held-out set (the code pair's): the turns shown, the reply streamed through the chat template to its
    end of turn or the token limit, measured against the target alone and identical to it; the first prompt."""
    from transformers import AutoTokenizer

    target, _ = save_tiny_pair(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(target)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(target)
    chats = [[{"role": "user", "content": "def f(x):"}], [{"role": "user", "content": "import os"}]]
    (tmp_path / "heldout.jsonl").write_text("".join(json.dumps({"messages": c}) + "\n" for c in chats))
    code, out, err = _run(capsys, "demo", "--models", str(tmp_path), "--max-new-tokens", "12", "--dtype", "fp32",
                          "--summary-prompts", "2")
    assert code == 0, err
    assert out.startswith("user: def f(x):\nassistant: ")
    assert "held-out prompt #0 " in err and "identical to target alone: yes" in err
    assert "2 held-out prompts: tau" in err and "identical to target alone: 2/2" in err
