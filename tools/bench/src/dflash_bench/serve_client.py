"""Streamed completions from N concurrent clients against a running OpenAI-compatible server (stdlib only).

`dflash bench serve` drives vLLM, SGLang or any server with a streamed `/v1/completions` through this
module: threads, each with its own `http.client` connection per request, take prompts from one queue
until none is left (a closed loop: a client sends its next request when its last one has ended), and
read the server-sent events as they arrive. Prompts go as token ids, so every engine sees exactly
the ids the reference decoded (no tokenizer or chat template of the server in between).

What a request records (`Reply`), times in seconds from the start of the run:
  sent_s   the request is sent;
  first_s  the first event that carries output (text or token ids): the time to first token is
           first_s - sent_s;
  done_s   the stream ended ([DONE]).
Engine facts the client reads: vLLM's Prometheus counters (`/metrics`, read before and after a run)
and SGLang's per-request `spec_verify_ct` (`sglext.spec_tokens_details`).
"""

from __future__ import annotations

import http.client
import json
import queue
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from dflash_core.errors import DFlashError

# the extra request fields each server kind understands (vLLM's pydantic models accept unknown fields; SGLang's
# may not, so each kind gets only its own)
API_FIELDS = {"vllm": {"return_token_ids": True}, "sglang": {"return_spec_tokens_details": True}, "openai": {}}
VLLM_DRAFT_STEPS = "vllm:spec_decode_num_drafts_total"  # verify steps that carried drafts, all requests
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"  # drafts accepted, all requests


class ServerUnreachable(DFlashError):
    """The server does not answer, or answers something other than an OpenAI-compatible API."""


@dataclass
class Reply:
    """One streamed completion as its client saw it (seconds from the start of the run)."""

    prompt: int  # index into the run's prompt list
    sent_s: float
    first_s: float | None = None  # the first event carrying output
    done_s: float = 0.0
    text: str = ""
    ids: list[int] | None = None  # output token ids, where the server returns them (vLLM: return_token_ids)
    completion_tokens: int = 0  # the usage event's count, else len(ids)
    verify_steps: int | None = None  # SGLang's spec_verify_ct for this request
    error: str | None = None

    @property
    def ttft_s(self) -> float:
        return (self.first_s if self.first_s is not None else self.done_s) - self.sent_s

    @property
    def latency_s(self) -> float:
        return self.done_s - self.sent_s


def sse_events(lines: Iterable[bytes]) -> Iterator[dict]:
    """The JSON payloads of a server-sent event stream's `data:` lines, up to `data: [DONE]`."""
    for line in lines:
        line = line.strip()
        if not line.startswith(b"data:"):
            continue  # blank separators, comments, other fields
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return
        yield json.loads(payload)


def apply_event(reply: Reply, event: dict, now: float) -> None:
    """Add one completion-stream event to `reply` (text, token ids, usage, SGLang's verify count)."""
    if "error" in event and not event.get("choices"):
        reply.error = _one_line(json.dumps(event["error"]))
        return
    for choice in event.get("choices") or []:
        text, ids = choice.get("text") or "", choice.get("token_ids")
        if (text or ids) and reply.first_s is None:
            reply.first_s = now
        reply.text += text
        if ids is not None:
            reply.ids = (reply.ids or []) + list(ids)
    usage = event.get("usage")
    if usage and usage.get("completion_tokens") is not None:
        reply.completion_tokens = int(usage["completion_tokens"])
    spec = (event.get("sglext") or {}).get("spec_tokens_details") or {}
    if spec.get("spec_verify_ct") is not None:
        reply.verify_steps = int(spec["spec_verify_ct"])


def stream_completion(url: str, body: dict, prompt: int, t0: float, *, timeout: float = 900) -> Reply:
    """POST `body` (streamed) to url/v1/completions and read the stream to its end; errors go in `reply.error`."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    reply = Reply(prompt, time.perf_counter() - t0)
    try:
        connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            reply.error = f"HTTP {response.status}: {_one_line(response.read().decode(errors='replace'))}"
        else:
            for event in sse_events(iter(response.fp.readline, b"")):
                apply_event(reply, event, time.perf_counter() - t0)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        reply.error = f"{type(exc).__name__}: {_one_line(str(exc))}"
    finally:
        connection.close()
    reply.done_s = time.perf_counter() - t0
    if not reply.completion_tokens and reply.ids is not None:
        reply.completion_tokens = len(reply.ids)
    return reply


def run_clients(url: str, bodies: list[dict], concurrency: int, *, timeout: float = 900) -> tuple[list[Reply], float]:
    """`concurrency` clients send `bodies` (one request each, in order from a shared queue); the replies in
    body order and the wall time from the first request sent to the last stream ended."""
    work: queue.Queue = queue.Queue()
    for item in enumerate(bodies):
        work.put(item)
    replies: list[Reply | None] = [None] * len(bodies)
    t0 = time.perf_counter()

    def client() -> None:
        while True:
            try:
                index, body = work.get_nowait()
            except queue.Empty:
                return
            replies[index] = stream_completion(url, body, index, t0, timeout=timeout)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(min(concurrency, len(bodies)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done = [r for r in replies if r is not None]
    return done, max(r.done_s for r in done) - min(r.sent_s for r in done)


def _get(url: str, path: str, *, timeout: float = 30) -> bytes:
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}{path}", timeout=timeout) as reply:
            return reply.read()
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise ServerUnreachable(f"cannot reach {url}{path} ({_one_line(str(reason))}); expected a running "
                                "OpenAI-compatible server at --url.") from None


def served_model(url: str) -> str:
    """The id of the first model the server lists at /v1/models."""
    try:
        return json.loads(_get(url, "/v1/models"))["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise ServerUnreachable(f"{url}/v1/models does not list a model; expected an OpenAI-compatible "
                                "server.") from None


def prometheus_counters(text: str, names: Iterable[str]) -> dict[str, float]:
    """Each named counter of a Prometheus text exposition, summed over its label sets (absent: 0)."""
    wanted = set(names)
    out = dict.fromkeys(wanted, 0.0)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in wanted:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


def vllm_counters(url: str) -> dict[str, float]:
    """vLLM's speculative counters now (draft steps and accepted drafts, over every request so far)."""
    return prometheus_counters(_get(url, "/metrics").decode(errors="replace"), (VLLM_DRAFT_STEPS, VLLM_ACCEPTED))


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]


@dataclass
class CompletionJob:
    """What every request of a run asks for (the prompt's ids vary)."""

    model: str
    max_tokens: int
    temperature: float = 0.0
    stop_token_ids: list[int] = field(default_factory=list)
    api: str = "vllm"  # which server's extra fields to send: vllm, sglang or openai

    def body(self, prompt_ids: list[int]) -> dict:
        return {"model": self.model, "prompt": list(prompt_ids), "max_tokens": self.max_tokens,
                "temperature": self.temperature, "stream": True, "stream_options": {"include_usage": True},
                "stop_token_ids": list(self.stop_token_ids), **API_FIELDS[self.api]}
