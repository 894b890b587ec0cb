"""Test harness: requests to a running SGLang server through the `openai` client (and its native /generate).

    .venv-sglang/bin/python tests/plugins/sglang_client.py < REQUEST_JSON > RESULTS_JSON

(run by test_sglang_serving.py).

Runs in the SGLang environment, where `openai` is installed as one of SGLang's dependencies (the
test process itself runs in .venv, which does not have it). REQUEST_JSON:
{"url": "http://127.0.0.1:PORT", "api": "generate" | "completions" | "chat", "stream": bool,
 "prompts": [str, ...], "max_tokens": int, "concurrency": int}
Writes one JSON list, one entry per prompt in order: {"text", "ids" (when the API gives them),
"prompt_ids" (chat), "spec" (SGLang's speculative counts for the request), "completion_tokens"}.
Greedy (temperature 0) throughout.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai

SPEC = {"return_spec_tokens_details": True}


def native(url: str, prompt: str, max_tokens: int) -> dict:
    body = json.dumps({"text": prompt, "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0}}).encode()
    request = urllib.request.Request(f"{url}/generate", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as reply:
        out = json.load(reply)
    meta = out["meta_info"]
    return {"text": out["text"], "ids": out["output_ids"], "completion_tokens": meta["completion_tokens"],
            "spec": {k: v for k, v in meta.items() if k.startswith("spec_")}}


def completion(client: openai.OpenAI, prompt: str, max_tokens: int, stream: bool) -> dict:
    kwargs = dict(model="served", prompt=prompt, max_tokens=max_tokens, temperature=0, extra_body=SPEC)
    if not stream:
        out = client.completions.create(**kwargs).model_dump()
        return {"text": out["choices"][0]["text"], "completion_tokens": out["usage"]["completion_tokens"],
                "spec": (out.get("sglext") or {}).get("spec_tokens_details")}
    text, spec = [], None
    for chunk in client.completions.create(stream=True, **kwargs):
        chunk = chunk.model_dump()
        text += [c["text"] for c in chunk["choices"]]
        spec = (chunk.get("sglext") or {}).get("spec_tokens_details") or spec
    return {"text": "".join(text), "chunks": len(text), "spec": spec}


def chat(client: openai.OpenAI, prompt: str, max_tokens: int, stream: bool) -> dict:
    kwargs = dict(model="served", messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
                  temperature=0, extra_body={**SPEC, "return_output_ids_in_sglext": True})
    if not stream:  # SGLang returns the prompt's token ids only without streaming
        kwargs["extra_body"]["return_prompt_token_ids"] = True
        out = client.chat.completions.create(**kwargs).model_dump()
        ext = out.get("sglext") or {}
        return {"text": out["choices"][0]["message"]["content"], "ids": ext.get("output_ids"),
                "prompt_ids": ext.get("prompt_token_ids") or out["choices"][0].get("prompt_token_ids"),
                "completion_tokens": out["usage"]["completion_tokens"], "spec": ext.get("spec_tokens_details"),
                "raw_ext_keys": sorted(ext)}
    text, ids, spec = [], [], None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        chunk = chunk.model_dump()
        text += [c["delta"].get("content") or "" for c in chunk["choices"]]
        ext = chunk.get("sglext") or {}
        ids += ext.get("output_ids") or []
        spec = ext.get("spec_tokens_details") or spec
    return {"text": "".join(text), "ids": ids or None, "chunks": len(text), "spec": spec}


def main() -> None:
    job = json.load(sys.stdin)
    url, api, stream, n = job["url"], job["api"], job.get("stream", False), job["max_tokens"]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=600, max_retries=0)

    def one(prompt: str) -> dict:
        if api == "generate":
            return native(url, prompt, n)
        if api == "completions":
            return completion(client, prompt, n, stream)
        return chat(client, prompt, n, stream)

    with ThreadPoolExecutor(max_workers=job.get("concurrency", 1)) as pool:
        results = list(pool.map(one, job["prompts"]))
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
