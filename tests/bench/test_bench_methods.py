"""`dflash bench e2e`'s methods: the runner table, the T=0 comparison with `ar` (and its negative control),
batch sizes a method cannot run, and one tiny end-to-end run writing JSON, Markdown and PNG files."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from tiny import save_tiny_pair

from dflash_bench import e2e, methods
from dflash_bench.methods import DecodeSettings, PromptBatch
from dflash_cli import main
from dflash_core import DFlashError
from dflash_core.loading import load_pair, stop_token_ids

PROMPTS = ["def main(", "import os\n", "x = [1, 2, 3]\nx = ["]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    target, drafter = save_tiny_pair(root)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    pair = load_pair(target, drafter, dtype="fp32")
    return root, target, drafter, prompts, pair


def _settings(pair, max_new_tokens=8) -> DecodeSettings:
    return DecodeSettings(max_new_tokens, tuple(stop_token_ids(pair.target, pair.tokenizer)))


def test_runner_table_has_the_peers_and_one_signature(tiny):
    *_, pair = tiny
    assert {"ar", "dflash", "prompt_lookup"} <= set(methods.RUNNERS)
    assert set(methods.DEFAULT_METHODS) == {"ar", "dflash", "dflash_drafter", "dflash_full", "prompt_lookup",
                                            "assisted"}
    ids = e2e.encode_prompts(pair, PROMPTS[:1], "cpu")
    batch = PromptBatch.of(ids, [0], pad_id=0)
    outputs = {}
    for name, runner in methods.RUNNERS.items():
        try:
            outputs[name] = runner(pair, batch, _settings(pair))
        except methods.NotApplicable:  # a weight-format twin of dflash where the drafter has no other format
            assert (name == "dflash_plain_weights" and pair.drafter.weight_format == "plain") or (
                name == "dflash_fp16_weights" and pair.drafter.weight_format in ("plain", "fp16-packed")), name
    for name, run in outputs.items():
        assert len(run.tokens) == 1 and 1 <= len(run.tokens[0]) <= 8 and run.seconds > 0, name
        assert run.tokens == outputs["ar"].tokens, name  # fp32, greedy: every method is the target's decoding
    assert outputs["dflash"].acceptance_lengths is not None


def test_prompt_lookup_batch_of_two_is_not_applicable_but_batched_methods_agree(tiny):
    *_, pair = tiny
    ids = e2e.encode_prompts(pair, PROMPTS[:2], "cpu")
    batch = PromptBatch.of(ids, [0, 1], pad_id=0)
    assert batch.attention_mask[0].tolist() != batch.attention_mask[1].tolist()  # unequal lengths: left padding
    with pytest.raises(methods.NotApplicable, match="one prompt at a time"):
        methods.run_prompt_lookup(pair, batch, _settings(pair))
    ar, spec = methods.run_ar(pair, batch, _settings(pair)), methods.run_dflash(pair, batch, _settings(pair))
    assert methods.compare_with_reference("dflash", ar, spec, batch.prompts, 2) == []


def test_first_difference():
    assert methods.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert methods.first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert methods.first_difference([1, 2], [1, 2, 3]) == 2


def test_negative_control_a_flipped_token_is_caught(tiny):
    """A method that changes one token must be reported with its name, prompt index and position."""
    *_, pair = tiny
    runners = {**methods.RUNNERS, "wrong": methods.flip_one_token(methods.run_ar, position=2)}
    ids = e2e.encode_prompts(pair, PROMPTS[:2], "cpu")
    comparison = e2e.compare(pair, ids, _settings(pair), methods=["ar", "dflash", "wrong"], runners=runners)
    assert [(m.method, m.prompt, m.position) for m in comparison.mismatches] == [("wrong", 0, 2), ("wrong", 1, 2)]
    assert "wrong differs from ar on prompt 0 at new token 2" in comparison.mismatches[0].line()
    rows = {r["method"]: r for r in e2e.summarize(comparison)}
    assert rows["dflash"]["identical"] == "2/2" and rows["wrong"]["identical"] == "0/2"


def test_fp32_mismatch_fails_the_run_after_writing_the_report(tiny, tmp_path):
    _, target, drafter, prompts, _ = tiny
    runners = {**methods.RUNNERS, "dflash": methods.flip_one_token(methods.run_dflash, position=1)}
    with pytest.raises(e2e.OutputMismatch, match="dflash differs from ar on prompt 0 at new token 1") as caught:
        e2e.run(tmp_path, [e2e.PairSpec("t", target, drafter)], prompts, prompts=1, max_new_tokens=6,
                dtypes=("fp32",), methods=["ar", "dflash"], runners=runners)
    assert caught.value.report.is_file()


def test_assisted_without_its_model_is_one_line(tiny, tmp_path, capsys):
    _, target, drafter, prompts, _ = tiny
    code = main(["bench", "e2e", "--methods", "ar,assisted", "--pair", f"t={target}:{drafter}",
                 "--prompts-file", str(prompts), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "assistant" in err and "missing" in err
    with pytest.raises(DFlashError, match="'beam'"):
        methods.check_methods(["ar", "beam"], assistant=tmp_path)


def test_bench_e2e_writes_json_markdown_and_plots(tiny, tmp_path, capsys):
    _, target, drafter, prompts, _ = tiny
    out = tmp_path / "out"
    code = main(["bench", "e2e", "--methods", "ar,dflash,prompt_lookup", "--batch-sizes", "1,2", "--prompts", "2",
                 "--max-new-tokens", "8", "--dtypes", "fp32", "--prompts-file", str(prompts),
                 "--pair", f"t={target}:{drafter}", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    for name in ("e2e.json", "e2e.md", "e2e.png", "e2e_per_prompt.png", "e2e_batch.png"):
        assert (out / name).stat().st_size > 0, name
    results = json.loads((out / "e2e.json").read_text())["data"]["results"]
    by = {(r["batch_size"], r["method"]): r for r in results}
    assert set(by) == {(b, m) for b in (1, 2) for m in ("ar", "dflash", "prompt_lookup")}
    assert by[(1, "prompt_lookup")]["identical"] == "2/2" and by[(2, "dflash")]["identical"] == "2/2"
    assert "batch" in by[(2, "prompt_lookup")]["n/a"]
    assert len(by[(1, "dflash")]["speedup_per_batch"]) == 2 and by[(1, "dflash")]["tau"] >= 1
    # each per-prompt figure names its prompts (file order), and the slowest is the one at the minimum
    one, two = by[(1, "dflash")], by[(2, "dflash")]
    assert one["prompts_per_batch"] == [[0], [1]] and two["prompts_per_batch"] == [[0, 1]]
    slowest = one["speedup_per_batch"].index(one["speedup_min"])
    assert one["slowest_prompts"] == [slowest] and two["slowest_prompts"] == [0, 1]
    markdown = (out / "e2e.md").read_text()
    assert "n/a (" in markdown and "speedup vs ar" in markdown and "Machine:" in markdown
    assert f"{one['speedup_min']:.2f} (#{slowest}) /" in markdown and "(#0,1) /" in markdown


def test_bench_e2e_reports_dflash_full_tau_and_the_cost_model_ceiling(tiny, tmp_path, capsys):
    _, target, drafter, prompts, _ = tiny
    out = tmp_path / "out"
    code = main(["bench", "e2e", "--methods", "ar,dflash,dflash_drafter,dflash_full", "--prompts", "2",
                 "--max-new-tokens", "12", "--dtypes", "fp32", "--prompts-file", str(prompts),
                 "--pair", f"t={target}:{drafter}", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    by = {r["method"]: r for r in json.loads((out / "e2e.json").read_text())["data"]["results"]}
    full, dflash = by["dflash_full"], by["dflash"]
    assert full["identical"] == "2/2" and full["tau"] >= 1 and "ceiling" not in full
    block = load_pair(target, drafter, dtype="fp32").drafter.config.block_size
    assert len(dflash["acceptance_by_position"]) == block - 1
    assert all(0.0 <= p <= 1.0 for p in dflash["acceptance_by_position"])
    assert dflash["ceiling"] >= 1.0 and 0 <= dflash["pooled_ceiling_k"] < block
    assert len(dflash["ceiling_per_batch"]) == 2 and min(dflash["ceiling_per_batch"]) >= 1.0
    assert min(dflash["ceiling_per_batch"]) <= dflash["ceiling"] <= max(dflash["ceiling_per_batch"])
    assert dflash["of_ceiling"] == pytest.approx(dflash["speedup"] / dflash["ceiling"])
    drafter_only = by["dflash_drafter"]  # the drafter's ceiling is reported for it too (it bounds that one)
    assert drafter_only["identical"] == "2/2" and drafter_only["ceiling"] == dflash["ceiling"]
    assert drafter_only["of_ceiling"] == pytest.approx(drafter_only["speedup"] / dflash["ceiling"])
    assert "cost-model ceiling" in (out / "e2e.md").read_text()


def test_repeats_keep_each_methods_fastest_round_and_the_same_outputs(tiny):
    *_, pair = tiny
    seen: list[float] = []

    def timed(pair, batch, settings):  # the real `ar`, reporting a different time each round
        run = methods.run_ar(pair, batch, settings)
        run.seconds = [3.0, 1.0, 2.0][len(seen) % 3]
        seen.append(run.seconds)
        return run

    ids = e2e.encode_prompts(pair, PROMPTS[:1], "cpu")
    runners = {**methods.RUNNERS, "ar": timed}
    comparison = e2e.compare(pair, ids, _settings(pair), methods=["ar", "dflash"], runners=runners, repeats=3)
    assert len(seen) == 4  # one warm-up round, then three timed rounds
    assert [r.seconds for r in comparison.runs["ar"]] == [1.0] and len(comparison.runs["dflash"]) == 1
    assert comparison.mismatches == []
    with pytest.raises(DFlashError, match="--repeats is 0"):
        e2e.compare(pair, ids, _settings(pair), methods=["ar"], repeats=0)


def test_demo_ends_with_one_line_comparing_the_three(tiny, capsys):
    root, *_ = tiny
    (root / "heldout.jsonl").write_text((root / "prompts.jsonl").read_text())
    code = main(["demo", "--models", str(root), "--max-new-tokens", "8", "--dtype", "fp32", "--summary-prompts", "0"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 0 and last.startswith("this prompt: ")
    assert "DFlash" in last and "target alone" in last and "prompt lookup" in last and last.endswith(": yes")


def test_assisted_generation_with_a_small_assistant_matches_ar(tmp_path, capsys):
    """`assisted` is Hugging Face assisted generation with the AR model beside the target; greedy == ar."""
    from tiny import tiny_target
    from transformers import AutoTokenizer

    target, drafter = save_tiny_pair(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(target)
    assistant = tiny_target(vocab=len(tokenizer), hidden=16, layers=1, heads=2, kv_heads=1, seed=5)
    assistant.generation_config.eos_token_id = tokenizer.eos_token_id
    assistant.save_pretrained(tmp_path / "assistant")
    tokenizer.save_pretrained(tmp_path / "assistant")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    out = tmp_path / "out"
    code = main(["bench", "e2e", "--prompts", "2", "--max-new-tokens", "8", "--dtypes", "fp32",
                 "--prompts-file", str(prompts), "--pair", f"t={target}:{drafter}", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    rows = json.loads((out / "e2e.json").read_text())["data"]["results"]
    assisted = [r for r in rows if r["method"] == "assisted"]  # in the default methods: the assistant exists
    assert assisted and all(r["identical"] == "2/2" for r in assisted), assisted


def test_plain_weights_beside_packed_ones_in_one_comparison(tiny):
    *_, pair = tiny
    loaded = pair.drafter.weight_format
    if loaded == "plain":
        pytest.skip("weight copies not possible or not faster here: the method is not applicable")
    ids = e2e.encode_prompts(pair, PROMPTS, "cpu")
    comparison = e2e.compare(pair, ids, _settings(pair), methods=("ar", "dflash", "dflash_plain_weights"))
    assert comparison.compared and comparison.mismatches == [] and not comparison.not_applicable
    assert pair.drafter.weight_format == loaded  # switched back after every run
    plain = load_pair(tiny[1], tiny[2], dtype="fp32", drafter_weights="plain")
    batch = PromptBatch.of(ids[:1], [0], pad_id=0)
    with pytest.raises(methods.NotApplicable, match="plain weights already"):
        methods.run_dflash_plain_weights(plain, batch, _settings(plain))


def test_fp16_copies_beside_bf16_ones_in_one_comparison(tiny, monkeypatch):
    """dflash_fp16_weights: where the drafter decodes bf16 copies, the same decoding with fp16-packed ones (real
    kernels; bf16 is allowed here even on a CPU that emulates it, so the test runs on every machine)."""
    from dflash_core.kernels import packed_weights

    if not packed_weights.fp16_packing_supported("cpu", torch.float32):
        pytest.skip("FBGEMM's fp16-weight GEMM is missing here")
    monkeypatch.setattr(packed_weights, "bf16_matmuls_supported", lambda device, dtype: dtype == torch.float32)
    pair = load_pair(tiny[1], tiny[2], dtype="fp32", drafter_weights="bf16")
    ids = e2e.encode_prompts(pair, PROMPTS, "cpu")
    comparison = e2e.compare(pair, ids, _settings(pair), methods=("ar", "dflash", "dflash_fp16_weights"))
    assert comparison.compared and comparison.mismatches == [] and not comparison.not_applicable
    assert pair.drafter.weight_format == "bf16" and set(pair.drafter._copies) == {"bf16", "fp16-packed"}
    packed = load_pair(tiny[1], tiny[2], dtype="fp32", drafter_weights="fp16-packed")
    batch = PromptBatch.of(ids[:1], [0], pad_id=0)
    with pytest.raises(methods.NotApplicable, match="fp16-packed weights already"):
        methods.run_dflash_fp16_weights(packed, batch, _settings(packed))


def test_prompts_the_target_answers_with_one_token_are_reported_apart(tiny):
    """A prompt whose first token is a stop token has nothing to speculate: its "speedup" is one prefill against
    another. The per-prompt minimum over the prompts that decode is reported beside the plain one."""
    from dflash_bench.e2e_report import _notes
    from dflash_core import generate_autoregressive

    *_, pair = tiny
    ids = e2e.encode_prompts(pair, PROMPTS, "cpu")
    firsts = [generate_autoregressive(pair.target, torch.tensor([p]), max_new_tokens=1).tokens[0][0] for p in ids]
    assert firsts[0] not in firsts[1:], "the test needs prompt 0 to start differently from the others"
    settings = DecodeSettings(8, (firsts[0],))  # prompt 0 stops at once
    comparison = e2e.compare(pair, ids, settings, methods=("ar", "dflash"))
    assert comparison.mismatches == [] and [len(t) for t in comparison.runs["ar"][0].tokens] == [1]
    rows = {r["method"]: r | {"pair": "t", "backend": "torch", "dtype": "fp32", "temperature": 0.0}
            for r in e2e.summarize(comparison)}
    dflash = rows["dflash"]
    assert dflash["single_token_prompts"] == [[0]] and dflash["slowest_decoding_prompts"] in ([1], [2])
    assert dflash["speedup_min_decoding"] == min(dflash["speedup_per_batch"][1:]) >= dflash["speedup_min"]
    notes = _notes(list(rows.values()), name="n", prompts_file=Path("p.jsonl"), prompts=3, max_new_tokens=8,
                   rounding_note=False)
    assert any(n.startswith("dflash, t fp32 T=0 batch 1: per-prompt minimum") and "(#0: one token" in n for n in notes)
    assert not any(n.startswith("ar, ") for n in notes)
    # where every prompt decodes, nothing is added
    decoded = e2e.compare(pair, ids, _settings(pair), methods=("ar", "dflash"))
    assert all(len(t) > 1 for run in decoded.runs["ar"] for t in run.tokens)
    assert all("single_token_prompts" not in r for r in e2e.summarize(decoded))


def test_speedups_on_the_text_every_method_shared_leave_out_the_prompts_one_method_wrote_differently(tiny):
    """In reduced precision a method may write other text after a near-tie; its speed there is measured on
    another workload. The shared-text figure counts only the batches where every method wrote ar's tokens."""
    from dflash_bench.e2e_report import _notes

    *_, pair = tiny
    ids = e2e.encode_prompts(pair, PROMPTS, "cpu")

    def wrong_on_prompt_1(pair_, batch, settings):  # a method parting from ar on one prompt only
        run = methods.run_ar(pair_, batch, settings)
        if batch.prompts == (1,):
            run.tokens[0][1] = (run.tokens[0][1] + 1) % pair_.target.vocab_size
        return run

    runners = {**methods.RUNNERS, "wrong": wrong_on_prompt_1}
    comparison = e2e.compare(pair, ids, _settings(pair), methods=["ar", "dflash", "wrong"], runners=runners)
    assert [(m.method, m.prompt) for m in comparison.mismatches] == [("wrong", 1)]
    rows = {r["method"]: r for r in e2e.summarize(comparison)}
    assert all(r["shared_text_batches"] == 2 for r in rows.values())
    ar, dflash = comparison.runs["ar"], comparison.runs["dflash"]
    rate = lambda runs: sum(len(runs[j].tokens[0]) for j in (0, 2)) / sum(runs[j].seconds for j in (0, 2))
    assert rows["dflash"]["shared_text_speedup"] == pytest.approx(rate(dflash) / rate(ar))
    assert rows["ar"]["shared_text_speedup"] == pytest.approx(1.0)
    labelled = [r | {"pair": "t", "backend": "torch", "dtype": "bf16", "temperature": 0.0} for r in rows.values()]
    notes = _notes(labelled, name="n", prompts_file=Path("p.jsonl"), prompts=3, max_new_tokens=8, rounding_note=True)
    shared = [n for n in notes if n.startswith("same text, t bf16 T=0 batch 1: on the 2 of 3 prompts")]
    assert len(shared) == 1 and "dflash " in shared[0] and "wrong " in shared[0]
    # where every method wrote ar's text, there is no second figure
    same = e2e.compare(pair, ids, _settings(pair), methods=["ar", "dflash"])
    assert all("shared_text_speedup" not in r for r in e2e.summarize(same))


def test_each_method_learns_from_earlier_requests_alone_and_every_round_replays_the_same_start(tiny, monkeypatch):
    """`generate` carries what earlier requests saw (the draft-length policy's acceptance history) from one
    request to the next. In the benchmark each method keeps its own, the warm-up adds none, and every round of
    a batch starts from the same one: rounds are repeats of one request, not more requests."""
    from dflash_core.tuning.cost_table import VerifyCostTable

    *_, pair = tiny
    # Costs where drafting pays (verify widths nearly free), so every method drafts from its first step: with the
    # tiny pair's measured table, a busy moment could make plain steps the best choice for a whole 12-token prompt,
    # leaving nothing learnt for the next batch to start from (seen once in CI).
    block = pair.drafter.config.block_size
    table = VerifyCostTable(seconds=tuple(1e-3 * (1 + 0.02 * q) for q in range(block)), draft_s=2e-4)
    tuning = pair.tuning
    monkeypatch.setattr(tuning, "cost_table", lambda *args, **kwargs: table)
    ids = e2e.encode_prompts(pair, PROMPTS, "cpu")
    seen: dict[str, list] = {}

    def recording(name, runner):
        def run(pair_, batch, settings):
            state = pair_.tuning.saved_histories(pair_.drafter)
            seen.setdefault(name, []).append((batch.prompts, _learnt(state)))
            return runner(pair_, batch, settings)
        return run

    runners = {**methods.RUNNERS, "dflash": recording("dflash", methods.run_dflash),
               "dflash_drafter": recording("dflash_drafter", methods.run_dflash_drafter)}
    tuning.restore_histories(pair.drafter, {})  # this test's own start, whatever the module's earlier tests taught
    tuning.history(pair.drafter).record(3, 1)  # something learnt before the benchmark
    before = _learnt(tuning.saved_histories(pair.drafter))
    e2e.compare(pair, ids, _settings(pair, 12), methods=["ar", "dflash", "dflash_drafter"], runners=runners, repeats=2)
    for name, calls in seen.items():
        warm_up, *timed = calls
        assert warm_up[1] == before, name  # the warm-up and the first batch start from what was there
        assert timed[0][1] == before and timed[1][1] == before, name
        rounds = {}
        for prompts, state in timed:
            rounds.setdefault(prompts, []).append(state)
        assert all(len(r) == 2 and r[0] == r[1] for r in rounds.values()), name  # both rounds, one start
        assert rounds[(1,)][0] != before, name  # and the next batch starts from what the previous one taught
    # dflash_drafter never drafts from the context: its own history has no "lookup" evidence from dflash's runs
    drafter_only = [state for _, state in seen["dflash_drafter"]]
    assert any(state.get("lookup", {}).get("reached", [0.0])[0] > 0 for _, state in seen["dflash"])  # some to leak
    assert all(state.get("lookup", {}).get("reached", [0.0])[0] == 0.0 for state in drafter_only)
    assert _learnt(tuning.saved_histories(pair.drafter)) == before  # left as found


def _learnt(histories: dict) -> dict:
    """What each saved history (and the token trees' calibration) holds, comparable with ==."""
    return {name: copy.deepcopy(vars(history)) for name, history in histories.items()}
