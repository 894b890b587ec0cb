"""SGLang's own server and DFLASH worker serve the demo pair on the CPU; its output is the target's, token for token.

One real server for the module (`dflash serve --engine sglang --device cpu`, fp32, with the chat
template `chat_template.jinja` beside this file, since the demo tokenizer has none: ChatML without
stop strings, so a chat reply ends where the target's does), queried through the `openai` client
and SGLang's native /generate. The client code runs in `.venv-sglang` (where `openai` comes with
SGLang) via `sglang_client.py`; the oracle is the core's `generate` and the target alone, here.
Skipped with the reason where `.venv-sglang` could not be built.

Acceptance: SGLang's per-request counts (`spec_verify_ct`, `spec_correct_drafts_histogram`) are
compared with the core's acceptance lengths at a fixed draft length of block - 1 (what SGLang's
DFLASH verifies every step): one verify step of SGLang is one core step, and a step that accepted
j drafts is histogram bin j (acceptance length j + 1). SGLang counts the token of the prefill in
`completion_tokens` and in `spec_accept_length` (= completion_tokens / verify steps), the core's
tau does not, so tau is compared through the histogram rather than those two averages. The one
difference seen and allowed: the last step of an output cut by max_new_tokens (see check_acceptance).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from served_processes import descendants, running

ROOT = Path(__file__).resolve().parents[2]
SGLANG_PYTHON = ROOT / ".venv-sglang" / "bin" / "python"
CLIENT = Path(__file__).with_name("sglang_client.py")
TARGET, DRAFTER = ROOT / "models" / "demo" / "target", ROOT / "models" / "demo" / "drafter"
HELDOUT = ROOT / "models" / "demo" / "heldout.jsonl"
MAX_NEW = 32
N_PROMPTS = 8
CHAT_TEMPLATE = Path(__file__).with_name("chat_template.jinja")
CHATML = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"  # what CHAT_TEMPLATE renders for one message
CONCURRENCY = 8  # the OpenAI-API tests send their 8 prompts at once (one at a time: /generate, 4 prompts)
pytestmark = pytest.mark.skipif(not (ROOT / ".venv-sglang" / ".installed").is_file(),
                                reason="no SGLang environment (.venv-sglang): `make sglang-env` could not build it")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prompts() -> list[str]:
    with open(HELDOUT) as f:
        return [json.loads(line)["prompt"] for line in f][:N_PROMPTS]


def dflash(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dflash_cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """The working directory of every `dflash serve` here: they share its runs/sglang-serve/ (one conversion)."""
    return tmp_path_factory.mktemp("serve")


@contextlib.contextmanager
def serving(target: Path, drafter: Path, cwd: Path, *extra: str):
    """`dflash serve --engine sglang` of a pair on the CPU, up once /health answers (it prints the URL then)."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "dflash_cli", "serve", "--engine", "sglang", "--target",
                                str(target), "--drafter", str(drafter), "--device", "cpu", "--port", str(port),
                                *(["--", *extra] if extra else [])],
                               cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in process.stdout:
            lines.append(line)
            if line.startswith("serving on"):
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    started = time.monotonic()
    while not ready.wait(2) and process.poll() is None and time.monotonic() - started < 900:
        pass
    if not ready.is_set():
        process.kill()
        pytest.fail(f"dflash serve did not come up: {''.join(lines)[-2000:]} {process.stderr.read()[-3000:]}")
    url = lines[-1].split()[2]
    try:
        yield SimpleNamespace(url=url, port=port, process=process, cwd=cwd, startup_s=time.monotonic() - started)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            process.wait(timeout=60)


@pytest.fixture(scope="module")
def server(workdir):
    """The demo pair served, with a chat template for the OpenAI chat API."""
    with serving(TARGET, DRAFTER, workdir, "--chat-template", str(CHAT_TEMPLATE)) as running_server:
        yield running_server


def make_oracle(target: Path, drafter: Path):
    """The core's speculative decode (draft length block-1, fp32, the drafter's own weights) and the target alone,
    per prompt text."""
    from dflash_core import generate, generate_autoregressive, load_pair
    from dflash_core.loading import encode_prompt, stop_token_ids

    # plain weights: SGLang's drafter multiplies by the checkpoint's own fp32 weights, and this test compares drafts
    # step by step; the core's CPU weight copies (fp16-packed, bf16: `packed_weights`) may move a near-tie draft
    # (the committed drafter's prompt 6 did, with bf16 copies on an AMX CPU: 11 steps against SGLang's 10)
    pair = load_pair(str(target), str(drafter), dtype="fp32", device="cpu", drafter_weights="plain")
    stops = stop_token_ids(pair.target, pair.tokenizer)
    block = pair.drafter.config.block_size
    cache: dict[str, SimpleNamespace] = {}

    def run(text: str) -> SimpleNamespace:
        if text not in cache:
            ids = encode_prompt(pair.tokenizer, text, "cpu")
            spec = generate(pair.target, pair.drafter, ids, max_new_tokens=MAX_NEW, stop_token_ids=stops,
                            draft_length=block - 1)
            alone = generate_autoregressive(pair.target, ids, max_new_tokens=MAX_NEW, stop_token_ids=stops)
            assert spec.tokens == alone.tokens, "the core itself parted from the target alone"
            tokens = spec.tokens[0]
            cache[text] = SimpleNamespace(prompt_ids=ids[0].tolist(), tokens=tokens,
                                          acceptance=spec.acceptance_lengths[0],
                                          text=pair.tokenizer.decode(tokens, skip_special_tokens=True))
        return cache[text]

    return run


@pytest.fixture(scope="module")
def oracle():
    return make_oracle(TARGET, DRAFTER)


def ask(server, api: str, texts: list[str], *, stream: bool = False, concurrency: int = 1) -> list[dict]:
    job = {"url": server.url, "api": api, "stream": stream, "prompts": texts, "max_tokens": MAX_NEW,
           "concurrency": concurrency}
    done = subprocess.run([str(SGLANG_PYTHON), str(CLIENT)], input=json.dumps(job), capture_output=True, text=True,
                          timeout=900, env={"PATH": "/usr/bin:/bin", "NO_PROXY": "127.0.0.1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _histogram(lengths: list[int]) -> list[int]:
    """Steps per number of accepted drafts (acceptance length - 1), as SGLang's spec_correct_drafts_histogram."""
    bins = [0] * (max(lengths, default=1))
    for length in lengths:
        bins[length - 1] += 1
    return bins


def _trim(bins: list[int]) -> list[int]:
    bins = list(bins)
    while bins and bins[-1] == 0:
        bins.pop()
    return bins


def check_acceptance(spec: dict, acceptance: list[int], where: str) -> None:
    """SGLang's verify steps and its histogram of accepted drafts per step equal the core's.

    One difference is expected and allowed, at the last step of an output cut by max_new_tokens:
    the core caps that step's acceptance at the tokens still wanted, SGLang counts every draft its
    verify accepted and then truncates the output. So the histograms may differ by that one step
    moving to a higher bin, never otherwise.
    """
    assert spec and spec["spec_verify_ct"] > 0, f"{where}: no speculative counts from SGLang (DFLASH did not run?)"
    assert spec["spec_verify_ct"] == len(acceptance), (
        f"{where}: SGLang verified {spec['spec_verify_ct']} steps, the core {len(acceptance)} ({acceptance})")
    theirs, ours = _trim(spec["spec_correct_drafts_histogram"]), _trim(_histogram(acceptance))
    if theirs != ours and 1 + sum(acceptance) == MAX_NEW:  # cut by max_new_tokens: move the core's last step up
        size = max(len(theirs), len(ours))
        diff = [a - b for a, b in zip(theirs + [0] * (size - len(theirs)), ours + [0] * (size - len(ours)))]
        moved = [i for i, d in enumerate(diff) if d]
        assert (len(moved) == 2 and diff[moved[0]] == -1 and diff[moved[1]] == 1
                and moved[0] == acceptance[-1] - 1), (
            f"{where}: SGLang's histogram {theirs} differs from the core's {ours} by more than the capped last step "
            f"(acceptance lengths {acceptance})")
        return
    assert theirs == ours, f"{where}: SGLang's accepted-draft histogram {theirs}, the core's {ours} ({acceptance})"
    assert spec["spec_num_correct_drafts"] == sum(acceptance) - len(acceptance)


ONE_AT_A_TIME: dict[str, list[dict]] = {}  # /generate results, one request at a time, for the concurrency test


def test_native_generate_is_the_target_token_for_token_with_the_cores_acceptance(server, oracle):
    """One request at a time (the reference of the concurrency test; the 8 prompts go through the OpenAI API below)."""
    texts = prompts()[:4]
    results = ask(server, "generate", texts)
    ONE_AT_A_TIME["generate"] = results
    for i, (text, got) in enumerate(zip(texts, results)):
        want = oracle(text)
        assert got["ids"] == want.tokens, f"prompt {i}: SGLang {got['ids']} vs core/target {want.tokens}"
        assert got["completion_tokens"] == len(want.tokens)
        check_acceptance(got["spec"], want.acceptance, f"prompt {i}")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_openai_completions_equal_the_target(server, oracle, stream):
    texts = prompts()
    results = ask(server, "completions", texts, stream=stream, concurrency=CONCURRENCY)
    for i, (text, got) in enumerate(zip(texts, results)):
        want = oracle(text)
        assert got["text"] == want.text, f"prompt {i}: {got['text']!r} vs core/target {want.text!r}"
        if stream:
            assert got["chunks"] > 1, "the completion was not streamed"
        else:
            assert got["completion_tokens"] == len(want.tokens)
        check_acceptance(got["spec"], want.acceptance, f"prompt {i}")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_openai_chat_completions_equal_the_target(server, oracle, stream):
    texts = prompts()
    results = ask(server, "chat", texts, stream=stream, concurrency=CONCURRENCY)
    for i, (text, got) in enumerate(zip(texts, results)):
        want = oracle(CHATML.format(text))
        if not stream:  # SGLang renders the chat exactly as the core's prompt here
            assert got["prompt_ids"] == want.prompt_ids, f"prompt {i}: the chat prompt SGLang built differs"
        ids = got["ids"][0] if got["ids"] and isinstance(got["ids"][0], list) else got["ids"]
        assert ids == want.tokens, f"prompt {i}: SGLang {ids} vs core/target {want.tokens}"
        assert got["text"] == want.text
        check_acceptance(got["spec"], want.acceptance, f"chat prompt {i}")


# ---- a Qwen2 target: SGLang's Qwen2ForCausalLM has no DFLASH capture method (dflash_sglang.targets) ----------

# two-line windows of a source file; those without near-ties are sent (without_near_ties)
QWEN2_SOURCE = [line for line in (ROOT / "tests" / "core" / "test_config.py").read_text().splitlines() if line.strip()]
QWEN2_PROMPTS = ["\n".join(QWEN2_SOURCE[i:i + 2]) for i in range(0, 60, 5)]


@pytest.fixture(scope="module")
def qwen2_pair(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny Qwen2 target and a drafter trained on its own answers for a few seconds (so its drafts are
    accepted often enough to show that SGLang feeds it the right layer's features)."""
    from tiny import tiny_target, tiny_tokenizer

    from dflash_cli import main

    root = tmp_path_factory.mktemp("qwen2")
    tokenizer = tiny_tokenizer()
    model = tiny_target("qwen2", vocab=len(tokenizer), hidden=32, layers=4, seed=0)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    lines = [line for line in Path(__file__).read_text().splitlines() if line.strip()][:120]
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": "\n".join(lines[i:i + 2])}) + "\n"
                                                for i in range(0, len(lines), 2)))
    fast = ["--dtype", "fp32", "--threads", "1"]
    assert main(["data", "--target", str(root / "target"), "--prompts", str(root / "prompts.jsonl"), "--out",
                 str(root / "data"), "--max-new-tokens", "48", "--batch-size", "16", "--shard-size", "64", *fast]) == 0
    assert main(["train", "--target", str(root / "target"), "--data", str(root / "data"), "--out",
                 str(root / "drafter"), "--block-size", "4", "--anchors", "8", "--batch-size", "8", "--max-steps", "150",
                 "--lr", "3e-3", "--save-dtype", "fp32", "--no-progress", *fast]) == 0
    return root / "target", root / "drafter"


def plain_outputs(target: Path, texts: list[str], cache: Path) -> list[list[int]]:
    """SGLang's own greedy answers, without a drafter (the same launch as `dflash serve` otherwise)."""
    from dflash_serving.supervise import Server
    from dflash_sglang.serve import launch_for

    launch = launch_for(target, None, port=free_port(), device="cpu", dtype="fp32", cache=cache)
    server = Server(launch, cache / "plain.log")
    try:
        server.wait_ready(900)
        return [r["ids"] for r in ask(SimpleNamespace(url=launch.url), "generate", texts)]
    finally:
        server.stop()


def test_a_qwen2_target_is_served_losslessly_with_the_cores_drafts_and_acceptance(qwen2_pair, workdir):
    """DFLASH on SGLang's Qwen2 answers exactly as SGLang's Qwen2 alone, and where that is the target alone of
    Hugging Face (SGLang's tiny random Qwen2 parts from it on some prompts, drafter or not: left to SGLang) its
    steps and accepted drafts are the core's, which needs the features of the drafter's own layer."""
    target, drafter = qwen2_pair
    oracle = make_oracle(target, drafter)
    plain = plain_outputs(target, QWEN2_PROMPTS, workdir / "qwen2-plain")
    with serving(target, drafter, workdir) as qwen2_server:
        results = ask(qwen2_server, "generate", QWEN2_PROMPTS)
    accepted = compared = 0
    for i, (text, got, alone) in enumerate(zip(QWEN2_PROMPTS, results, plain)):
        assert got["ids"] == alone, f"prompt {i}: SGLang DFLASH {got['ids']} vs SGLang alone {alone}"
        want = oracle(text)
        if got["ids"] != want.tokens:
            continue
        check_acceptance(got["spec"], want.acceptance, f"qwen2 prompt {i}")
        accepted += sum(want.acceptance) - len(want.acceptance)
        compared += 1
    assert compared >= 6, f"only {compared} of {len(QWEN2_PROMPTS)} prompts answered as Hugging Face's target does"
    assert accepted >= 10, f"only {accepted} drafts accepted: too few to tell the right features from others"


def test_sglang_still_lacks_a_dflash_method_on_qwen2_and_refuses_such_targets():
    """The hook of dflash_sglang.targets answers these two lines of the installed SGLang."""
    from dflash_sglang import targets

    site = next((ROOT / ".venv-sglang" / "lib").glob("python3*/site-packages"))
    qwen2 = (site / "sglang/srt/models/qwen2.py").read_text()
    assert "def set_eagle3_layers_to_capture" in qwen2 and "def set_dflash_layers_to_capture" not in qwen2
    module, text = targets.EVIDENCE
    assert text in (site / (module.replace(".", "/") + ".py")).read_text()


def test_four_concurrent_requests_give_the_one_at_a_time_outputs(server, oracle):
    texts = prompts()[:4]
    alone = ONE_AT_A_TIME.get("generate") or ask(server, "generate", texts)
    together = ask(server, "generate", texts, concurrency=4)
    assert [r["ids"] for r in together] == [r["ids"] for r in alone[:4]]
    assert [r["text"] for r in together] == [oracle(t).text for t in texts]


def test_ctrl_c_stops_the_server_and_everything_it_started(server):
    started = descendants(server.process.pid)
    assert len(started) >= 3, f"expected SGLang's server, scheduler and detokenizer below dflash serve: {started}"
    server.process.send_signal(signal.SIGINT)
    assert server.process.wait(timeout=90) == 0
    alive = {pid for pid in started if running(pid)}
    assert not alive, f"processes SGLang started outlived Ctrl-C: {alive}"
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{server.url}/health", timeout=5)
    with socket.socket() as s:  # nothing listens on the port any more (TIME_WAIT of old connections aside)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", server.port))


def _converted(tmp_path: Path) -> Path:
    out = tmp_path / "sgl"
    done = subprocess.run([sys.executable, "-m", "dflash_convert", str(DRAFTER), "--to", "sglang", "--out", str(out),
                           "--dtype", "fp32"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return out


def test_a_damaged_drafter_is_refused_in_one_line_before_sglang_starts(tmp_path):
    draft = _converted(tmp_path)
    weights = draft / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    done = dflash("serve", "--target", str(TARGET), "--drafter", str(draft), "--device", "cpu",
                  "--port", str(free_port()), cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "dflash serve: error: draft directory" in done.stderr
    assert "changed since dflash-convert wrote it" in done.stderr
    assert not (tmp_path / "runs" / "sglang-serve" / "logs").exists(), "SGLang was started"
    assert bytes(data) == weights.read_bytes(), "the input was modified"


def test_a_server_that_dies_exits_non_zero_with_sglangs_last_error_line(workdir):
    done = dflash("serve", "--target", str(TARGET), "--drafter", str(DRAFTER), "--device", "cpu",
                  "--port", str(free_port()), "--", "--context-length", "many", cwd=workdir)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("dflash serve: error: SGLang exited with status")
    assert "argument --context-length" in last and "nvalid integer" in last


def test_print_command_and_a_missing_sglang_environment(workdir, tmp_path):
    before = {p.name: p.read_bytes() for p in DRAFTER.iterdir()}
    done = dflash("serve", "--target", str(TARGET), "--drafter", str(DRAFTER), "--device", "cpu", "--print-command",
                  cwd=workdir)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert line.startswith("SGLANG_USE_CPU_ENGINE=1 PYTHONPATH=") and "stand_in" in line
    assert "-m sglang.launch_server" in line and "--speculative-algorithm DFLASH" in line
    assert "--device cpu --attention-backend torch_native" in line and "--dtype float32" in line
    assert before == {p.name: p.read_bytes() for p in DRAFTER.iterdir()}, "the drafter was modified"
    missing = dflash("serve", "--target", str(TARGET), "--drafter", str(DRAFTER),
                     "--sglang-python", str(tmp_path / "none" / "python"), cwd=tmp_path)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "make sglang-env" in missing.stderr
