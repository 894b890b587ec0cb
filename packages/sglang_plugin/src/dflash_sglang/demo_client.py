"""The client half of `make demo-sglang`: one streamed completion through the `openai` client, then SGLang's figures.

    .venv-sglang/bin/python -m dflash_sglang.demo_client URL MAX_TOKENS RESULT_JSON < PROMPT

Runs in the SGLang environment (where `openai` comes with SGLang). Streams the text to stdout as it
arrives, then writes RESULT_JSON: the text, SGLang's speculative counts for the request, the
completion's token count and the wall time from request to last chunk.
"""

from __future__ import annotations

import json
import sys
import time

import openai


def main(url: str, max_tokens: int, result: str, prompt: str) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=900, max_retries=0)
    start = time.perf_counter()
    spec, usage, first, text = None, None, None, []
    stream = client.completions.create(model="served", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                       stream=True, stream_options={"include_usage": True},
                                       extra_body={"return_spec_tokens_details": True})
    for chunk in stream:
        chunk = chunk.model_dump()
        for choice in chunk["choices"]:
            if choice["text"]:
                first = first or time.perf_counter()
                text.append(choice["text"])
                sys.stdout.write(choice["text"])
                sys.stdout.flush()
        spec = (chunk.get("sglext") or {}).get("spec_tokens_details") or spec
        usage = chunk.get("usage") or usage
    end = time.perf_counter()
    print()
    with open(result, "w") as out:
        json.dump({"text": "".join(text), "spec": spec, "completion_tokens": (usage or {}).get("completion_tokens"),
                   "wall_s": end - start, "first_token_s": (first or end) - start}, out)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.stdin.read())
