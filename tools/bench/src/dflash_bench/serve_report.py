"""Writing `dflash bench serve`'s results: JSON + Markdown (`report.write_report`) and two PNG plots."""

from __future__ import annotations

from pathlib import Path

from .report import plot_lines, write_report
from .serve_engines import plain_of

COLUMNS = ["engine", "N", "total tok/s", "tok/s per user", "TTFT mean / p90 (ms)", "mean accepted length",
           "vs plain: total / per user", "identical to the target alone"]


def add_ratios(rows: list[dict]) -> None:
    """On each speculative row whose plain engine ran at the same N: its total and per-user speed over plain's."""
    measured = [r for r in rows if "failed" not in r]
    plain = {(r["engine"], r["concurrency"]): r for r in measured}
    for row in measured:
        base = plain.get((plain_of(row["engine"]), row["concurrency"]))
        if base is not None:
            row["vs_plain_total"] = row["total_tok_s"] / base["total_tok_s"]
            row["vs_plain_per_user"] = row["per_user_tok_s"] / base["per_user_tok_s"]


def table_row(r: dict) -> list:
    if "failed" in r:
        return [r["engine"], r["concurrency"], f"failed (and every larger N): {r['failed']}", "", "", "", "", ""]
    accepted = "n/a" if r["accepted_length"] is None else f"{r['accepted_length']:.2f}"
    ratio = (f"**{r['vs_plain_total']:.2f}x** / {r['vs_plain_per_user']:.2f}x" if "vs_plain_total" in r else "")
    if r["identical"] is None:
        identical = "n/a (T > 0)"
    else:
        identical = f"{r['identical']}/{r['requests']}"
        if r["mismatches"]:
            first = r["mismatches"][0]
            identical += f" (first: prompt {first['prompt']}, {'token' if first['by'] == 'ids' else 'character'} " \
                         f"{first['position']})"
    return [r["engine"], r["concurrency"], round(r["total_tok_s"], 1), round(r["per_user_tok_s"], 1),
            f"{1000 * r['ttft_mean_s']:.0f} / {1000 * r['ttft_p90_s']:.0f}", accepted, ratio, identical]


def _notes(name: str, *, pair: str, prompts_file: Path, prompts: int, request: dict, dtype: str,
           served: list[str]) -> list[str]:
    t = request["temperature"]
    notes = [
        f"pair {pair}, {dtype}; {prompts} prompts from {prompts_file}, sent as token ids, up to "
        f"{request['max_tokens']} new tokens each, temperature {t:g}, stop tokens {list(request['stop_token_ids'])}; N clients at once, each "
        "sending its next prompt when its last reply has ended, after one untimed warm-up request per engine",
        "total tok/s: all output tokens / wall time of the run; tok/s per user: all output tokens / the sum of the "
        "requests' latencies (each sent to its last streamed event: queueing and the first token included); TTFT: sent "
        "to the first streamed event that carries output",
        "mean accepted length: tokens committed per verify step, the prefill's token not counted (1 + accepted drafts "
        "/ verify steps): vLLM's Prometheus counters spec_decode_num_accepted_tokens / spec_decode_num_drafts, read "
        "before and after each run; SGLang's spec_verify_ct per request; the core's own counts (its plain steps, "
        "k = 0, included); n/a: no drafts",
        "core, core-plain: the core's loop in the benchmark's process, the prompts taken N at a time and decoded "
        "together (`generate_stream`; core-plain: no drafts, k = 0 every step); a row's TTFT is its batch's prefill, "
        "its latency ends at the step that ended it",
    ]
    if t == 0:
        notes.append("identical: every output against the target alone's greedy decoding (the core's "
                     "`generate_autoregressive`, one prompt at a time, the same ids and stop tokens), token for token "
                     "where the engine returns ids (vLLM, the core), else character for character (SGLang)")
    if any(e.startswith("vllm-dflash") for e in served):
        notes.append("vllm-dflash: `dflash serve --engine vllm` (on a CPU 3 drafts verified a step, on a GPU the whole "
                     "block); vllm-dflash-kK: the same with --draft-length K (K drafts of the drafter's whole block)")
    if t > 0 and any(e.startswith("sglang") for e in served):
        notes.append("SGLang on a CPU verifies drafts greedily at any temperature (docs/sglang-cpu.md): its T > 0 "
                     "output is not a sample of the target")
    notes.append(f"plots: {name}_total.png (total tok/s vs N), {name}_per_user.png (tok/s per user vs N: read across "
                 "at a per-user speed to see how many users each engine serves at it)")
    return notes


def _plots(out: Path, name: str, title: str, rows: list[dict]) -> None:
    totals, per_user = {}, {}
    for r in rows:
        if "failed" in r:
            continue
        for series, key in ((totals, "total_tok_s"), (per_user, "per_user_tok_s")):
            xs, ys = series.setdefault(r["engine"], ([], []))
            xs.append(r["concurrency"])
            ys.append(r[key])
    ticks = sorted({r["concurrency"] for r in rows if "failed" not in r})
    plot_lines(out / f"{name}_total.png", f"{title}: total throughput", "concurrent users (N)",
               "output tokens / s, all users", totals, logx=True, xticks=ticks)
    plot_lines(out / f"{name}_per_user.png", f"{title}: speed per user", "concurrent users (N)",
               "output tokens / s, per user", per_user, logx=True, xticks=ticks)


def write(out: Path, name: str, rows: list[dict], *, title: str, command: str, pair: str, prompts_file: Path,
          prompts: int, request: dict, dtype: str, served: list[str]) -> Path:
    """out/name.json (every row, each request's tokens and times included), out/name.md, the plots; the .md path."""
    out.mkdir(parents=True, exist_ok=True)
    add_ratios(rows)
    _plots(out, name, title, rows)
    notes = _notes(name, pair=pair, prompts_file=prompts_file, prompts=prompts, request=request, dtype=dtype,
                   served=served)
    envs = {r["engine"]: r["server_env"] for r in rows if r.get("server_env")}
    if envs:
        notes.append("server environment added by the plugin: " + "; ".join(
            f"{engine}: " + " ".join(f"{k}={v}" for k, v in env.items()) for engine, env in envs.items())
            + " (the other servers: their engine's defaults)")
    return write_report(out, name, title=title, command=command, columns=COLUMNS, rows=[table_row(r) for r in rows],
                        data={"results": rows, "request": request, "pair": pair}, notes=notes)
