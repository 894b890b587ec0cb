"""The engines `dflash bench serve` measures, each answering one run of N concurrent users the same way.

- served (`vllm-plain`, `vllm-dflash`, `vllm-dflash-kK`, `sglang-plain`, `sglang-dflash`, or any server at
  `--url`): the engine's own OpenAI server, started here through its plugin (`dflash_vllm.serve.launch_for`,
  `dflash_sglang.serve.launch_for`: plain is the same launch without a drafter; `vllm-dflash-kK` verifies the
  first K drafts of the block each step, `dflash serve --draft-length K`) and stopped after its runs, or
  already running; N streaming clients (`serve_client.run_clients`).
- in-process (`core`, `core-plain`): the core's batched loop, the prompts taken N at a time and decoded
  together by `generate_stream` (`core`: its defaults; `core-plain`: k = 0 every step, the target alone
  through the same loop); a row's first token is the prefill's, its last the step that ended it.

Mean accepted length, from each engine's own counts: tokens committed per verify step (the prefill's token
not counted), i.e. 1 + accepted drafts / verify steps: vLLM's Prometheus counters, SGLang's per-request
`spec_verify_ct` ((completion tokens - 1) / verify steps), the core's `acceptance_lengths` (its plain steps,
k = 0, included).
"""

from __future__ import annotations

import contextlib
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Protocol

from dflash_core.decode.choice import FixedChoice
from dflash_core.decode.loop import generate_stream
from dflash_core.decode.sources import PlainSource
from dflash_core.errors import DFlashError
from dflash_core.loading import Pair

from .methods import PromptBatch
from .serve_client import (VLLM_ACCEPTED, VLLM_DRAFT_STEPS, CompletionJob, Reply, run_clients, served_model,
                           vllm_counters)

SERVED = ("vllm-plain", "vllm-dflash", "sglang-plain", "sglang-dflash")
IN_PROCESS = ("core-plain", "core")
ENGINES = SERVED + IN_PROCESS
DRAFT_LENGTH = re.compile(r"vllm-dflash-k([1-9][0-9]*)")  # vllm-dflash verifying K drafts a step


def known_engine(name: str) -> bool:
    return name in ENGINES or DRAFT_LENGTH.fullmatch(name) is not None


def plain_of(name: str) -> str | None:
    """The plain engine a speculative one is compared with (None: it is plain, or has none)."""
    if DRAFT_LENGTH.fullmatch(name):
        return "vllm-plain"
    return {"vllm-dflash": "vllm-plain", "sglang-dflash": "sglang-plain", "core": "core-plain"}.get(name)
# every served engine: one model name whatever the path, so a URL's listing and the requests agree
SERVED_NAME = ["--served-model-name", "served"]


@dataclass(frozen=True)
class Request:
    """What every request of a run asks for: the prompt's ids vary, the rest does not."""

    max_tokens: int
    temperature: float
    stop_token_ids: tuple[int, ...]
    seed: int = 0  # the core's sampling seed (batch j uses seed + j); servers are sent none (docs/vllm-cpu.md)


@dataclass
class EngineRun:
    """One engine at one concurrency: every reply (in prompt order), the wall time, the engine's acceptance."""

    replies: list[Reply]
    wall_s: float
    accepted_length: float | None  # tokens committed per verify step (None: the engine drafts nothing)


class Engine(Protocol):
    name: str

    def run(self, prompts: list[list[int]], concurrency: int, request: Request) -> EngineRun: ...


class ServedEngine:
    """A running OpenAI-compatible server at `url`, driven by N streaming clients."""

    def __init__(self, name: str, url: str, api: str, env: dict[str, str] | None = None) -> None:
        self.name, self.url, self.api = name, url.rstrip("/"), api
        self.env = dict(env or {})  # what the plugin added to the server's environment (its report says so)
        self.model = served_model(self.url)

    def run(self, prompts: list[list[int]], concurrency: int, request: Request) -> EngineRun:
        job = CompletionJob(self.model, request.max_tokens, request.temperature, list(request.stop_token_ids),
                            self.api)
        before = vllm_counters(self.url) if self.api == "vllm" else None
        replies, wall = run_clients(self.url, [job.body(p) for p in prompts], concurrency)
        failed = [r for r in replies if r.error]
        if failed:
            raise DFlashError(f"{self.name}: {len(failed)} of {len(replies)} requests failed at concurrency "
                              f"{concurrency}; the first: {failed[0].error}")
        return EngineRun(replies, wall, self._accepted_length(replies, before))

    def _accepted_length(self, replies: list[Reply], before: dict | None) -> float | None:
        if before is not None:
            time.sleep(0.5)  # the API server records the last steps' counts as their outputs arrive
            after = vllm_counters(self.url)
            steps = after[VLLM_DRAFT_STEPS] - before[VLLM_DRAFT_STEPS]
            return 1 + (after[VLLM_ACCEPTED] - before[VLLM_ACCEPTED]) / steps if steps else None
        return sglang_accepted_length(replies)


def sglang_accepted_length(replies: list[Reply]) -> float | None:
    """Tokens per verify step over SGLang's replies: (completion tokens - 1) / spec_verify_ct, summed.

    A request that ended at its prefill's token never verified and SGLang sends no speculative details for it
    (tokenizer_manager: only when spec_verify_ct > 0): it counts 0 steps. None when a longer reply has none
    (a server without speculative decoding, or one that does not report it) or nothing was verified."""
    steps = [0 if r.verify_steps is None and (r.completion_tokens or 0) <= 1 else r.verify_steps for r in replies]
    if any(s is None for s in steps) or not sum(steps):
        return None
    return sum(max(0, (r.completion_tokens or 0) - 1) for r in replies) / sum(steps)


@contextlib.contextmanager
def started(name: str, target: Path, drafter: Path, *, dtype: str, cache: Path,
            timeout: float = 900) -> Iterator[ServedEngine]:
    """Start engine `name` (one of SERVED, or vllm-dflash-kK) through its plugin on a free port, yield it once
    /health answers,
    stop it (its whole process group) on the way out. Converted drafters and the log go to cache/ENGINE/."""
    engine, method = name.split("-")[:2]
    k = DRAFT_LENGTH.fullmatch(name)
    try:
        from dflash_serving.supervise import Server

        if engine == "vllm":
            from dflash_vllm.serve import launch_for
        else:
            from dflash_sglang.serve import launch_for
    except ImportError:
        raise DFlashError(f"--engines {name} needs the dflash-{engine} plugin package: `make setup` installs it "
                          f"(pip install -e packages/{engine}_plugin).") from None
    cache = cache / engine  # each engine's converted drafters apart (one key per drafter and dtype)
    launch = launch_for(target, drafter if method == "dflash" else None, port=_free_port(), dtype=dtype,
                        extra=SERVED_NAME, cache=cache, **({"draft_length": int(k.group(1))} if k else {}))
    server = Server(launch, cache / "logs" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.log")
    try:
        server.wait_ready(timeout)
        yield ServedEngine(name, launch.url, engine, launch.env)
    finally:
        server.stop()


class CoreEngine:
    """The core's own loop in this process: the prompts N at a time, each batch decoded together."""

    def __init__(self, name: str, pair: Pair) -> None:
        self.name, self.pair = name, pair

    def run(self, prompts: list[list[int]], concurrency: int, request: Request) -> EngineRun:
        replies, committed, t0 = [], [], time.perf_counter()
        for j, start in enumerate(range(0, len(prompts), concurrency)):
            index = list(range(start, min(start + concurrency, len(prompts))))
            batch_replies, steps = self._batch(prompts, index, request, j, t0)
            replies += batch_replies
            committed += steps
        wall = max(r.done_s for r in replies)
        accepted = sum(committed) / len(committed) if committed and self.name == "core" else None
        return EngineRun(replies, wall, accepted)

    def _batch(self, prompts: list[list[int]], index: list[int], request: Request, j: int,
               t0: float) -> tuple[list[Reply], list[int]]:
        """One batch through generate_stream: each row's reply, and the tokens every verify step committed."""
        pair, pad = self.pair, request.stop_token_ids[0] if request.stop_token_ids else 0
        batch = PromptBatch.of([prompts[i] for i in index], index, pad_id=pad, device=pair.target.device)
        plain = {"chooser": FixedChoice(PlainSource(), 0)} if self.name == "core-plain" else {}
        sent = time.perf_counter() - t0
        replies = [Reply(i, sent) for i in index]
        stream = generate_stream(pair.target, pair.drafter, batch.input_ids, attention_mask=batch.attention_mask,
                                 max_new_tokens=request.max_tokens, temperature=request.temperature,
                                 stop_token_ids=list(request.stop_token_ids), seed=request.seed + j,
                                 tuning=pair.tuning, **plain)
        for emitted in stream:
            now = time.perf_counter() - t0
            for reply, tokens in zip(replies, emitted):
                if tokens:
                    reply.first_s = now if reply.first_s is None else reply.first_s
                    reply.done_s = now
        result = stream.result
        for reply, tokens in zip(replies, result.tokens):
            reply.ids, reply.completion_tokens = list(tokens), len(tokens)
            reply.done_s = reply.done_s or time.perf_counter() - t0
        return replies, [a for row in result.acceptance_lengths for a in row]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
