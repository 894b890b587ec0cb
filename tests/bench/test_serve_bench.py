"""`dflash bench serve`: the stream and metrics parsing, the core engine, the report, refusals, and a real vLLM server.

The parsing tests read a response captured from vLLM 0.32's CPU server (a streamed /v1/completions with
token ids and usage; /metrics) and events of SGLang's shape. The server tests start vLLM's DFlash on the demo pair
once for the module through the plugin (`serve_engines.started`), and are skipped with the reason where
`.venv-vllm` could not be built; everything else runs on the CPU in this environment.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_bench import serve_bench, serve_report
from dflash_bench.serve_client import (VLLM_ACCEPTED, VLLM_DRAFT_STEPS, CompletionJob, Reply, apply_event,
                                       prometheus_counters, sse_events)
from dflash_bench.serve_engines import CoreEngine, Request, sglang_accepted_length, started

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "models" / "demo"
HAS_VLLM = (ROOT / ".venv-vllm" / ".installed").is_file()

# a streamed completion from vLLM 0.32's CPU server (demo pair, DFlash, prompt ids [40, 41, 42, 43], 6 tokens,
# return_token_ids, include_usage) and its speculative /metrics lines, as captured from the wire
DATA = Path(__file__).with_name("data")
VLLM_STREAM = (DATA / "vllm_completion_stream.txt").read_bytes()
VLLM_METRICS = (DATA / "vllm_metrics.txt").read_text()


def test_a_vllm_stream_gives_text_ids_usage_and_the_first_token_time():
    reply = Reply(prompt=0, sent_s=0.0)
    for t, event in enumerate(sse_events(VLLM_STREAM.splitlines(keepends=True)), start=1):
        apply_event(reply, event, float(t))
    assert reply.text == "JJJJJJ" and reply.ids == [43] * 6
    assert reply.completion_tokens == 6 and reply.first_s == 1.0 and reply.error is None
    assert reply.verify_steps is None


def test_sglang_verify_counts_and_stream_errors_are_read():
    reply = Reply(prompt=3, sent_s=0.5)
    apply_event(reply, {"choices": [{"index": 0, "text": "x"}]}, 0.7)
    apply_event(reply, {"choices": [], "usage": {"completion_tokens": 9},
                        "sglext": {"spec_tokens_details": {"spec_verify_ct": 4}}}, 0.9)
    assert reply.ids is None and reply.verify_steps == 4 and reply.completion_tokens == 9
    assert reply.ttft_s == pytest.approx(0.2)
    broken = Reply(prompt=0, sent_s=0.0)
    apply_event(broken, {"error": {"message": "engine dead", "code": 500}}, 1.0)
    assert "engine dead" in broken.error


def test_sglang_accepted_length_counts_a_request_that_ended_at_its_first_token_as_no_step():
    def reply(tokens, steps):
        return Reply(prompt=0, sent_s=0.0, completion_tokens=tokens, verify_steps=steps)

    # 95 + 47 tokens after the prefill's in 40 + 20 steps; the third ended at its first token (no details sent)
    assert sglang_accepted_length([reply(96, 40), reply(48, 20), reply(1, None)]) == pytest.approx(142 / 60)
    assert sglang_accepted_length([reply(96, 40), reply(48, None)]) is None  # a longer reply without them
    assert sglang_accepted_length([reply(1, None), reply(1, None)]) is None  # nothing verified
    assert sglang_accepted_length([reply(96, None)]) is None  # a plain server


def test_prometheus_counters_sum_label_sets_and_skip_lookalikes():
    second_engine = 'vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="served"} 7.0\n'
    counters = prometheus_counters(VLLM_METRICS + second_engine, (VLLM_DRAFT_STEPS, VLLM_ACCEPTED, "vllm:absent_total"))
    assert counters == {VLLM_DRAFT_STEPS: 5.0, VLLM_ACCEPTED: 7.0, "vllm:absent_total": 0.0}  # not the *_created


def test_each_server_kind_gets_only_its_own_request_fields():
    vllm = CompletionJob("served", 16, 0.0, [0], "vllm").body([5, 6])
    assert vllm["prompt"] == [5, 6] and vllm["return_token_ids"] and vllm["stream"]
    assert vllm["stream_options"] == {"include_usage": True} and vllm["stop_token_ids"] == [0]
    sglang = CompletionJob("served", 16, api="sglang").body([5])
    assert "return_token_ids" not in sglang and sglang["return_spec_tokens_details"]


def test_plain_launches_are_the_dflash_launches_without_the_speculative_flags():
    from dflash_core.model.config import DFlashConfig
    from dflash_sglang.layout import launch_command as sglang_command
    from dflash_vllm.layout import launch_command as vllm_command

    def without(command: list[str], flags: set[str]) -> list[str]:
        kept = [a for i, a in enumerate(command) if a not in flags and (i == 0 or command[i - 1] not in flags)]
        return kept

    config = DFlashConfig.from_pretrained(DEMO / "drafter")
    for command, flags in ((vllm_command, {"--speculative-config"}),
                           (sglang_command, {"--speculative-algorithm", "--speculative-draft-model-path",
                                             "--speculative-num-draft-tokens"})):
        spec = command("/m/t", "/m/d", config, dtype="fp32", port=9, extra=["--x"])
        assert set(spec) & flags == flags
        assert command("/m/t", None, None, dtype="fp32", port=9, extra=["--x"]) == without(spec, flags)


# ---- the core engine and the report ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo():
    from dflash_bench.e2e import encode_prompts
    from dflash_core.loading import load_pair, stop_token_ids
    from dflash_core.training.data import read_prompts

    pair = load_pair(DEMO / "target", DEMO / "drafter", dtype="fp32", device="cpu")
    ids = encode_prompts(pair, read_prompts(DEMO / "heldout.jsonl")[:4], "cpu")
    request = Request(24, 0.0, tuple(stop_token_ids(pair.target, pair.tokenizer)))
    return pair, ids, request, serve_bench.references(pair, ids, request)


def test_the_core_engines_in_batches_equal_the_target_alone(demo):
    pair, ids, request, reference = demo
    for name in ("core", "core-plain"):
        for n in (1, 3):
            run = CoreEngine(name, pair).run(ids, n, request)
            assert [r.prompt for r in run.replies] == [0, 1, 2, 3]
            assert serve_bench.compare(reference, run.replies) == [], f"{name} at N={n}"
            assert all(0 < r.ttft_s <= r.latency_s for r in run.replies)
            assert run.wall_s >= max(r.latency_s for r in run.replies)
            assert (run.accepted_length is None) == (name == "core-plain")
            assert name == "core-plain" or run.accepted_length > 1


def test_a_changed_token_or_text_is_found_where_it_differs(demo):
    _, _, _, reference = demo
    ids = list(reference.ids[1])
    ids[3] += 1
    text = reference.texts[2][:5] + "#" + reference.texts[2][6:]
    first = reference.ids[0]
    toggled = first[:-1] if first[-1] in reference.stops else first + [min(reference.stops)]  # the final stop token
    replies = [Reply(1, 0.0, ids=ids), Reply(2, 0.0, text=text), Reply(0, 0.0, ids=toggled)]
    found = serve_bench.compare(reference, replies)
    assert found == [{"prompt": 1, "position": 3, "by": "ids"}, {"prompt": 2, "position": 5, "by": "text"}]


def test_the_report_is_written_whole_with_ratios_to_plain(demo, tmp_path):
    pair, ids, request, reference = demo
    rows = []
    for name in ("core-plain", "core"):
        rows += serve_bench.measure(CoreEngine(name, pair), ids[:2], [1, 2], request, reference, say=lambda _: None)
    rows.append(dict(rows[-1], engine="vllm-dflash", server_env={"OMP_WAIT_POLICY": "PASSIVE"}))  # as a plugin's
    md = serve_report.write(tmp_path, "serve", rows, title="t", command="dflash bench serve", pair="demo",
                            prompts_file=DEMO / "heldout.jsonl", prompts=2, request={"temperature": 0.0,
                            "max_tokens": 24, "stop_token_ids": [0]}, dtype="fp32", served=[])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["serve.json", "serve.md", "serve_per_user.png",
                                                          "serve_total.png"]  # no temporary file left behind
    data = json.loads((tmp_path / "serve.json").read_text())
    core = [r for r in data["data"]["results"] if r["engine"] == "core"]
    assert [r["concurrency"] for r in core] == [1, 2] and all(r["identical"] == 2 for r in core)
    assert all(r["vs_plain_total"] > 0 and len(r["per_request"]) == 2 for r in core)
    assert "| core | 2 |" in md.read_text() and data["machine"]["cpu"]
    assert "server environment added by the plugin: vllm-dflash: OMP_WAIT_POLICY=PASSIVE" in md.read_text()


def test_a_vllm_engine_of_k_drafts_a_step_is_named_and_compared_with_plain_vllm():
    from dflash_bench.serve_engines import known_engine, plain_of

    assert known_engine("vllm-dflash-k3") and known_engine("vllm-dflash-k15") and not known_engine("sglang-dflash-k3")
    assert not known_engine("vllm-dflash-k0") and not known_engine("vllm-dflash-k")
    assert plain_of("vllm-dflash-k3") == plain_of("vllm-dflash") == "vllm-plain" and plain_of("core") == "core-plain"
    assert plain_of("vllm-plain") is None
    rows = [{"engine": "vllm-plain", "concurrency": 1, "total_tok_s": 100.0, "per_user_tok_s": 100.0},
            {"engine": "vllm-dflash-k3", "concurrency": 1, "total_tok_s": 110.0, "per_user_tok_s": 110.0}]
    serve_report.add_ratios(rows)
    assert rows[1]["vs_plain_total"] == pytest.approx(1.1) and "vs_plain_total" not in rows[0]


# ---- refusals: one line, non-zero exit -------------------------------------------------------------------------


def dflash(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dflash_cli", "bench", "serve", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


@pytest.mark.parametrize("args, words", [
    (["--url", "http://127.0.0.1:{port}", "--engines", ""], "cannot reach http://127.0.0.1:"),
    (["--concurrency", "1,0"], "--concurrency"),
    (["--concurrency", "two"], "--concurrency"),
    (["--engines", "vllm-dflash,tgi"], "'tgi'"),
    (["--engines", "vllm-dflash-k0"], "'vllm-dflash-k0'"),
    (["--pair", "nowhere"], "--pair nowhere"),
], ids=["unreachable-url", "zero-users", "not-a-number", "unknown-engine", "no-drafts-engine", "unknown-pair"])
def test_bad_input_is_one_line_and_a_non_zero_exit(tmp_path, args, words):
    args = [a.format(port=closed_port()) for a in args]
    done = dflash(*args, "--out", str(tmp_path / "out"), cwd=ROOT)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and words in done.stderr, done.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


# ---- a real vLLM server (DFlash, demo pair) --------------------------------------------------------------------

needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="no vLLM environment (.venv-vllm): `make vllm-env` could not "
                                                     "build it")


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    with started("vllm-dflash", DEMO / "target", DEMO / "drafter", dtype="fp32",
                 cache=tmp_path_factory.mktemp("vllm")) as engine:
        yield engine


@needs_vllm
@pytest.mark.slow
def test_vllm_dflash_at_one_and_four_users_gives_the_target_alones_outputs(vllm_server, demo):
    _, ids, request, reference = demo
    rows = serve_bench.measure(vllm_server, ids, [1, 4], request, reference, say=lambda _: None)
    for row in rows:
        assert row["identical"] == len(ids), row["mismatches"]
        assert row["accepted_length"] > 1.5, "vLLM's counters show no accepted drafts"
        assert 0 < row["ttft_mean_s"] < row["wall_s"] and row["tokens"] == sum(len(t) for t in reference.ids)


@needs_vllm
@pytest.mark.slow
def test_the_command_drives_a_running_server_at_url(vllm_server, tmp_path):
    done = dflash("--url", vllm_server.url, "--engines", "", "--label", "running", "--concurrency", "1,2",
                  "--prompts", "2", "--max-new-tokens", "8", "--out", str(tmp_path), cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads((tmp_path / "serve.json").read_text())["data"]["results"]
    assert [(r["engine"], r["concurrency"], r["identical"]) for r in rows] == [("running", 1, 2), ("running", 2, 2)]
    assert "| running | 2 |" in done.stdout
