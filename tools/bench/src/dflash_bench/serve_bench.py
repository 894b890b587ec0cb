"""Served concurrency: N concurrent streamed users per engine, speed and losslessness (`dflash bench serve`).

For every engine (`serve_engines`: vLLM and SGLang each plain and with DFlash, started here through their
plugins or already running at a URL; the core's own batched loop, plain and DFlash) and every concurrency
N, the same held-out prompts are sent as token ids by N clients at once (a closed loop: each client sends
its next prompt when its last reply has ended), after one untimed warm-up request per engine. Per engine
and N it reports:

  total tok/s     every output token / the run's wall time (first request sent to last reply ended);
  tok/s per user  output tokens / seconds waited for them, over all requests (each request's latency: sent to
                  last event, the queue and the first token included): what one user sees;
  TTFT            time to the first event that carries output, mean and 90th percentile;
  accepted length the engine's own tokens per verify step (`serve_engines`);
  identical       at T=0, every output against the target alone's greedy decoding by the core
                  (`generate_autoregressive`, one prompt at a time, the same ids and stop tokens): token ids
                  where the server returns them (vLLM, the core), else the text (SGLang); a final stop token
                  is not compared (engines differ in whether they return it).
"""

from __future__ import annotations

import contextlib
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch

from dflash_core.decode.autoregressive import generate_autoregressive
from dflash_core.errors import DFlashError
from dflash_core.loading import Pair, load_pair, stop_token_ids
from dflash_core.training.data import read_prompts
from dflash_core.tuning.plan import Tuning

from . import serve_report
from .e2e import OutputMismatch, encode_prompts
from .methods import first_difference
from .serve_engines import (ENGINES, IN_PROCESS, CoreEngine, Engine, EngineRun, Request, ServedEngine, known_engine,
                            started)
from .serve_client import Reply

WARMUP_TOKENS = 8


@dataclass(frozen=True)
class ServePair:
    """The pair every engine serves: its label in the report and its directories."""

    label: str
    target: Path
    drafter: Path


@dataclass(frozen=True)
class Reference:
    """The target alone's greedy output per prompt, as ids and as the text a server would stream."""

    ids: list[list[int]]
    texts: list[str]
    stops: frozenset[int]


def check_request(engines: Sequence[str], concurrency: Sequence[int], url: str | None, api: str) -> None:
    """Refuse, in one line, what cannot run (before anything loads or starts)."""
    unknown = [e for e in engines if not known_engine(e)]
    if unknown:
        raise DFlashError(f"--engines names {unknown[0]!r}; expected some of {', '.join(ENGINES)}, vllm-dflash-kK.")
    if not engines and not url:
        raise DFlashError("nothing to measure: give --engines, --url, or both.")
    bad = [n for n in concurrency if isinstance(n, bool) or not isinstance(n, int) or n < 1]
    if bad or not concurrency:
        raise DFlashError(f"--concurrency {bad[0] if bad else '(empty)'}: expected integers >= 1, e.g. 1,2,4,8,16.")
    if api not in ("vllm", "sglang", "openai"):
        raise DFlashError(f"--api {api!r}; expected vllm, sglang or openai.")


def references(pair: Pair, prompts: list[list[int]], request: Request) -> Reference:
    """The target alone, greedy, one prompt at a time: what every engine's greedy output must equal."""
    ids = []
    for prompt in prompts:
        result = generate_autoregressive(pair.target, torch.tensor([prompt], device=pair.target.device),
                                         max_new_tokens=request.max_tokens, stop_token_ids=list(request.stop_token_ids))
        ids.append(result.tokens[0])
    texts = [pair.tokenizer.decode(t, skip_special_tokens=True) for t in ids]
    return Reference(ids, texts, frozenset(request.stop_token_ids))


def compare(reference: Reference, replies: list[Reply]) -> list[dict]:
    """One {prompt, position} per reply that is not the reference's output (position: first differing token,
    or character where only text was returned)."""
    found = []
    for reply in replies:
        if reply.ids is not None:
            want, got = _unstopped(reference.ids[reply.prompt], reference.stops), _unstopped(reply.ids, reference.stops)
        else:
            want, got = reference.texts[reply.prompt], reply.text
        position = first_difference(want, got)
        if position is not None:
            by = "ids" if reply.ids is not None else "text"
            found.append({"prompt": reply.prompt, "position": position, "by": by})
    return found


def _unstopped(ids: Sequence[int], stops: frozenset[int]) -> list[int]:
    return list(ids[:-1]) if ids and ids[-1] in stops else list(ids)


def summarize(engine: str, concurrency: int, run: EngineRun, mismatches: list[dict] | None) -> dict:
    """One row: the run's speed, latency and acceptance, and how its outputs compare (None: not compared)."""
    replies = run.replies
    tokens = sum(r.completion_tokens for r in replies)
    ttfts = sorted(r.ttft_s for r in replies)
    return {
        "engine": engine, "concurrency": concurrency, "requests": len(replies), "tokens": tokens,
        "wall_s": run.wall_s, "total_tok_s": tokens / run.wall_s, "per_user_tok_s": per_user_rate(replies),
        "ttft_mean_s": statistics.fmean(ttfts), "ttft_p90_s": ttfts[min(len(ttfts) - 1, int(0.9 * len(ttfts)))],
        "accepted_length": run.accepted_length,
        "identical": None if mismatches is None else len(replies) - len(mismatches), "mismatches": mismatches,
        "per_request": [{"prompt": r.prompt, "tokens": r.completion_tokens, "ttft_s": round(r.ttft_s, 5),
                         "latency_s": round(r.latency_s, 5)} for r in replies],
    }


def measure(engine: Engine, prompts: list[list[int]], concurrency: Sequence[int], request: Request,
            reference: Reference | None, say=lambda line: print(line, file=sys.stderr, flush=True)) -> list[dict]:
    """One untimed warm-up request, then a run at every concurrency; a row each."""
    rows = []
    try:
        engine.run(prompts[:1], 1, Request(min(WARMUP_TOKENS, request.max_tokens), request.temperature,
                                           request.stop_token_ids, request.seed))
        for n in concurrency:
            run = engine.run(prompts, n, request)
            mismatches = compare(reference, run.replies) if reference is not None else None
            rows.append(summarize(engine.name, n, run, mismatches))
            if getattr(engine, "env", None):
                rows[-1]["server_env"] = engine.env
            say(progress_line(rows[-1]))
    except DFlashError as exc:  # a server that did not start or died: recorded, and the next engine runs
        failed_at = concurrency[len(rows)]
        rows.append({"engine": engine.name, "concurrency": failed_at, "failed": str(exc)})
        say(f"{engine.name:14s} N={failed_at:<3d} failed: {exc}")
    return rows


def per_user_rate(replies: list[Reply]) -> float:
    """What one user sees: output tokens / seconds waited, over all requests (sum over sum, so that a reply of one
    token, stopped at once, does not weigh as much as one of a hundred)."""
    return sum(r.completion_tokens for r in replies) / sum(r.latency_s for r in replies)


def progress_line(row: dict) -> str:
    accepted = "-" if row["accepted_length"] is None else f"{row['accepted_length']:.2f}"
    identical = "-" if row["identical"] is None else f"{row['identical']}/{row['requests']}"
    return (f"{row['engine']:14s} N={row['concurrency']:<3d} {row['total_tok_s']:8.1f} tok/s total "
            f"{row['per_user_tok_s']:7.1f} per user  TTFT {1000 * row['ttft_mean_s']:7.1f} ms  accepted {accepted}  "
            f"identical {identical}")


def engines_in_turn(names: Sequence[str], pair: Pair, spec: ServePair, *, url: str | None, api: str, label: str,
                    dtype: str, cache: Path) -> Iterator[Engine]:
    """Each engine in turn, a server started just before its runs and stopped right after them."""
    if url:
        yield ServedEngine(label, url, api)
    for name in names:
        if name in IN_PROCESS:
            yield CoreEngine(name, pair)
            continue
        with contextlib.ExitStack() as stack:
            try:
                engine = stack.enter_context(started(name, spec.target, spec.drafter, dtype=dtype, cache=cache))
            except DFlashError as exc:
                engine = NotStarted(name, str(exc))
            yield engine


@dataclass(frozen=True)
class NotStarted:
    """An engine whose server did not come up: each run says why (the report records it, the others still run)."""

    name: str
    reason: str

    def run(self, prompts: list[list[int]], concurrency: int, request: Request) -> EngineRun:
        raise DFlashError(f"{self.name} did not start: {self.reason}")


def run(out: Path, name: str, spec: ServePair, prompts_file: Path, *, engines: Sequence[str],
        concurrency: Sequence[int], prompts: int, max_new_tokens: int, temperature: float = 0.0,
        url: str | None = None, api: str = "vllm", label: str = "url", dtype: str = "fp32",
        cache: Path = Path("runs") / "bench-serve", command: str, title: str) -> Path:
    """Measure every engine at every concurrency; out/name.{json,md} and the plots; returns the .md path."""
    check_request(engines, concurrency, url, api)
    if url:
        ServedEngine(label, url, api)  # an unreachable server: one line, before anything loads
    texts = read_prompts(prompts_file)[:prompts]
    pair = load_pair(spec.target, spec.drafter, dtype=dtype, device="cpu", tuning=Tuning.cached())
    for note in pair.notes:
        print(f"note: {note}", file=sys.stderr)
    request = Request(max_new_tokens, temperature, tuple(stop_token_ids(pair.target, pair.tokenizer)))
    ids = encode_prompts(pair, texts, "cpu")
    reference = references(pair, ids, request) if temperature == 0 else None
    rows = []
    # closing: a failed run stops the server it was measuring before the error leaves this function
    turns = engines_in_turn(engines, pair, spec, url=url, api=api, label=label, dtype=dtype, cache=cache)
    with contextlib.closing(turns) as each:
        for engine in each:
            rows += measure(engine, ids, concurrency, request, reference)
    path = serve_report.write(out, name, rows, title=title, command=command, pair=spec.label, prompts_file=prompts_file,
                              prompts=len(texts), request=asdict(request), dtype=dtype,
                              served=[e for e in engines if e not in IN_PROCESS] + ([label] if url else []))
    problems = [f"{r['engine']} failed at N={r['concurrency']}" for r in rows if "failed" in r]
    problems += [f"{r['engine']} at N={r['concurrency']}: {r['requests'] - r['identical']} of {r['requests']} outputs "
                 f"differ from the target alone's" for r in rows if r.get("mismatches") and dtype == "fp32"]
    if problems:
        raise Incomplete(f"{'; '.join(problems)}; report: {path}", path)
    return path


class Incomplete(OutputMismatch):
    """An engine did not run, or a greedy output is not the target's (raised after the report is written)."""
