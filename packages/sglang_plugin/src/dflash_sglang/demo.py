"""`make demo-sglang`: the demo pair served by SGLang's own DFLASH server on this machine, beside the core.

    .venv/bin/python -m dflash_sglang.demo [--models models/demo] [--prompt-index 1] [--max-new-tokens 128]

Starts the server (as `dflash serve` does: the CPU when no GPU is seen, fp32 there), streams one
held-out completion through the `openai` client (run in the SGLang environment, `demo_client`), stops
the server, then decodes the same prompt with the core's `generate` and prints both sides: tau
(accepted tokens per verify step, the core's definition: the prefill token not counted) and tokens/s
(new tokens per second of wall time, prefill included; SGLang's over HTTP).
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
from pathlib import Path

from .server import Server
from .serving import (build_launch, check_target, find_sglang_python, prepare_drafter, probe, resolve_device,
                      served_dtype)

CACHE = Path("runs") / "sglang-serve"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sglang_side(models: Path, prompt: str, max_new: int) -> tuple[dict, str]:
    """Serve, stream one completion to stdout, stop; SGLang's figures and the streamed text."""
    python = find_sglang_python()
    facts = probe(python)
    device = resolve_device("auto", facts)
    dtype = served_dtype("auto", device)
    target = check_target(models / "target")
    draft = prepare_drafter(models / "drafter", target, dtype, CACHE / "drafters")
    launch = build_launch(target.resolve(), draft.resolve(), device=device, dtype=dtype, port=_free_port(),
                          facts=facts, python=python)
    server = Server(launch, CACHE / "logs" / f"demo-{launch.port}.log")
    try:
        print(f"SGLang {device} ({dtype}): starting {launch.url} (about a minute on a CPU) ...", flush=True)
        server.wait_ready(900)
        print(f"--- streamed by SGLang through the openai client ({max_new} tokens max) ---", flush=True)
        result_file = CACHE / "logs" / f"demo-{launch.port}.json"
        done = subprocess.run([str(python), "-m", "dflash_sglang.demo_client", launch.url, str(max_new),
                               str(result_file)], input=prompt, text=True)
        if done.returncode != 0:
            raise SystemExit("the openai client failed (its error is above)")
        result = json.loads(result_file.read_text())
        return {**result, "device": device, "dtype": dtype}, result["text"]
    finally:
        server.stop()


def core_side(models: Path, prompt: str, max_new: int, dtype: str) -> dict:
    from dflash_core import DecodeProfile, generate, load_pair
    from dflash_core.tuning.plan import Tuning
    from dflash_core.loading import encode_prompt, stop_token_ids

    pair = load_pair(str(models / "target"), str(models / "drafter"), dtype=dtype, device="cpu", tuning=Tuning.cached())
    ids = encode_prompt(pair.tokenizer, prompt, "cpu")
    stops = stop_token_ids(pair.target, pair.tokenizer)
    generate(pair.target, pair.drafter, ids, max_new_tokens=8, stop_token_ids=stops, tuning=pair.tuning)  # warm-up
    figures = {}
    for name, length in (("fixed", pair.drafter.config.block_size - 1), ("auto", "auto")):
        profile = DecodeProfile()
        result = generate(pair.target, pair.drafter, ids, max_new_tokens=max_new, stop_token_ids=stops, tuning=pair.tuning,
                          draft_length=length, profile=profile)
        figures[name] = {"tau": result.tau, "tokens_per_s": profile.tokens_per_s(result.num_new_tokens),
                         "text": pair.tokenizer.decode(result.tokens[0], skip_special_tokens=True)}
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dflash_sglang.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=Path("models") / "demo")
    parser.add_argument("--prompt-index", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args(argv)
    with open(args.models / "heldout.jsonl") as f:
        prompt = [json.loads(line)["prompt"] for line in f][args.prompt_index]
    sglang, streamed = sglang_side(args.models, prompt, args.max_new_tokens)
    spec, n = sglang["spec"], sglang["completion_tokens"]
    core = core_side(args.models, prompt, args.max_new_tokens, {"float32": "fp32", "bfloat16": "bf16"}.get(
        sglang["dtype"], "fp32"))
    tau = (n - 1) / spec["spec_verify_ct"]  # the core's tau: accepted per step, the prefill token not counted
    print(f"\n--- held-out prompt {args.prompt_index}, {n} new tokens, {sglang['device']} {sglang['dtype']} ---")
    print(f"{'':34s}{'tau':>8s}{'tokens/s':>10s}")
    print(f"{'SGLang DFLASH (HTTP, block 16)':34s}{tau:8.2f}{n / sglang['wall_s']:10.1f}"
          f"   (SGLang's spec_accept_length {spec['spec_accept_length']:.2f} counts the prefill token)")
    for name, label in (("fixed", "core generate, draft length 15"), ("auto", "core generate, draft length auto")):
        print(f"{label:34s}{core[name]['tau']:8.2f}{core[name]['tokens_per_s']:10.1f}")
    same = streamed == core["fixed"]["text"]
    print(f"SGLang's text identical to the core's (= the target alone): {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
