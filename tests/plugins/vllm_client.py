"""Test harness: requests to a running vLLM server through the `openai` client (and raw HTTP for the abuse cases).

    .venv-vllm/bin/python tests/plugins/vllm_client.py < REQUEST_JSON > RESULTS_JSON

(run by test_vllm_serving.py). Runs in vLLM's environment, where `openai` is one of vLLM's
dependencies (the test process runs in .venv, which does not have it). REQUEST_JSON:
{"url": "http://127.0.0.1:PORT", "model": NAME, "api": "completions" | "chat" | "disconnect" | "malformed"
 | "metrics", "stream": bool, "prompts": [str, ...], "max_tokens": int, "concurrency": int,
 "sampling": {"temperature": .., "top_k": .., "seed": ..} (optional; default greedy),
 "repeat": int (optional: that many requests of prompts[0], unseeded),
 "tolerate_errors": bool (optional: a failed request gives {"error": ...} instead of failing the run)}
Writes one JSON value: a list with one entry per prompt (or seed) in order,
{"text", "ids", "prompt_ids", "chunks", "completion_tokens"}, or for "metrics" the speculative counters.
"""

from __future__ import annotations

import http.client
import json
import sys
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai

IDS = {"return_token_ids": True}


def completion(client: openai.OpenAI, model: str, prompt: str, max_tokens: int, stream: bool, sampling: dict) -> dict:
    sampling = dict(sampling)
    kwargs = dict(model=model, prompt=prompt, max_tokens=max_tokens, temperature=sampling.pop("temperature", 0),
                  seed=sampling.pop("seed", None), extra_body={**IDS, **sampling})
    if not stream:
        out = client.completions.create(**kwargs).model_dump()
        choice = out["choices"][0]
        return {"text": choice["text"], "ids": choice.get("token_ids"), "prompt_ids": choice.get("prompt_token_ids"),
                "completion_tokens": out["usage"]["completion_tokens"]}
    text, ids = [], []
    for chunk in client.completions.create(stream=True, **kwargs):
        for choice in chunk.model_dump()["choices"]:
            text.append(choice["text"])
            ids += choice.get("token_ids") or []
    return {"text": "".join(text), "ids": ids, "chunks": len(text)}


def chat(client: openai.OpenAI, model: str, prompt: str, max_tokens: int, stream: bool, sampling: dict) -> dict:
    kwargs = dict(model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
                  temperature=0, extra_body=dict(IDS))
    if not stream:
        out = client.chat.completions.create(**kwargs).model_dump()
        choice = out["choices"][0]
        return {"text": choice["message"]["content"], "ids": choice.get("token_ids"),
                "prompt_ids": out.get("prompt_token_ids"), "completion_tokens": out["usage"]["completion_tokens"]}
    text, ids = [], []
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.model_dump()["choices"]:
            text.append(choice["delta"].get("content") or "")
            ids += choice.get("token_ids") or []
    return {"text": "".join(text), "ids": ids, "chunks": len(text)}


def disconnect(url: str, model: str, prompt: str) -> dict:
    """Start a long streamed completion, read two chunks, and hang up."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 1000, "temperature": 0, "stream": True,
                       "ignore_eos": True})
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    reply = conn.getresponse()
    chunks = 0
    while chunks < 2:
        line = reply.fp.readline()
        if line.startswith(b"data:"):
            chunks += 1
    conn.sock.close()  # mid-stream: the server must notice, abort the request and go on serving
    conn.close()
    return {"status": reply.status, "chunks": chunks}


def malformed(url: str) -> dict:
    """Requests no server should act on: broken JSON, a wrong field type, an unknown model."""
    statuses = []
    for body in (b"{not json", json.dumps({"model": "x", "prompt": "hi", "max_tokens": "many"}).encode(),
                 json.dumps({"prompt": 12, "max_tokens": -5}).encode()):
        request = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:
                statuses.append(reply.status)
        except urllib.error.HTTPError as exc:
            statuses.append(exc.code)
    return {"statuses": statuses}


def metrics(url: str) -> dict:
    """vLLM's speculative counters from /metrics (summed over label sets)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=60) as reply:
        text = reply.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        for name in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                     "vllm:spec_decode_num_accepted_tokens_total"):
            if line.startswith(name + "{") or line.startswith(name + " "):
                out[name.split(":")[1]] = out.get(name.split(":")[1], 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def main() -> None:
    job = json.load(sys.stdin)
    url, api, model = job["url"], job["api"], job.get("model", "served")
    if api == "metrics":
        json.dump(metrics(url), sys.stdout)
        return
    if api == "malformed":
        json.dump(malformed(url), sys.stdout)
        return
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=600 if not job.get("tolerate_errors") else 60,
                           max_retries=0)
    stream, n, sampling = job.get("stream", False), job.get("max_tokens", 32), job.get("sampling") or {}
    if "repeat" in job:  # independent samples of one prompt
        work = [(job["prompts"][0], sampling)] * job["repeat"]
    else:
        work = [(prompt, sampling) for prompt in job["prompts"]]

    def one(item) -> dict:
        prompt, params = item
        if api == "disconnect":
            return disconnect(url, model, prompt)
        call = completion if api == "completions" else chat
        if not job.get("tolerate_errors"):
            return call(client, model, prompt, n, stream, params)
        try:
            return call(client, model, prompt, n, stream, params)
        except openai.OpenAIError as exc:  # a negative control may break the server: report, do not raise
            return {"error": " ".join(str(exc).split())[:300]}

    with ThreadPoolExecutor(max_workers=job.get("concurrency", 1)) as pool:
        results = list(pool.map(one, work))
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
