"""`dflash generate`: speculative decoding of one prompt, optionally side by side with the target alone."""

from __future__ import annotations

import sys

from ..autoregressive import generate_autoregressive
from ..decoding import GenerationResult, generate_stream
from ..sampling import SamplingParams
from .common import add_runtime_args, apply_threads, encode, load_pair, print_json, read_prompt, stop_token_ids


def add_parser(commands) -> None:
    p = commands.add_parser("generate", help="generate with a target and its DFlash drafter")
    p.add_argument("--target", required=True, help="Hugging Face target model directory (with tokenizer)")
    p.add_argument("--drafter", required=True,
                   help="drafter directory (published format), or with --drafter-backend onnxruntime a .onnx file "
                        "or a dflash-convert --to onnx directory")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="prompt text")
    source.add_argument("--prompt-file", help="file holding the prompt text")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None, help="seed for sampling")
    p.add_argument("--stream", action="store_true", help="print text as it is committed")
    p.add_argument("--compare-ar", action="store_true", help="also run the target alone; report speedup and match")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--drafter-backend", choices=["torch", "onnxruntime"], default="torch",
                   help="run the drafter in torch (default) or its exported ONNX graph with ONNX Runtime")
    add_runtime_args(p)
    p.set_defaults(run=run)


class TextStream:
    """Incremental detokenization: print only text that can no longer change."""

    def __init__(self, tokenizer, out=None) -> None:
        self.tokenizer, self.out = tokenizer, out or sys.stdout
        self.tokens: list[int] = []
        self.printed = 0

    def push(self, tokens: list[int], final: bool = False) -> None:
        self.tokens.extend(tokens)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        stable = len(text) if final else len(text.rstrip("\ufffd"))
        if stable > self.printed:
            self.out.write(text[self.printed:stable])
            self.out.flush()
            self.printed = stable


def run_speculative(pair, ids, args, stops, on_tokens=None) -> GenerationResult:
    stream = generate_stream(pair.target, pair.drafter, ids, max_new_tokens=args.max_new_tokens,
                             temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                             stop_token_ids=stops, seed=args.seed)
    for chunk in stream:
        if on_tokens is not None:
            on_tokens(chunk[0])
    return stream.result


def warm_up(pair, ids, args, stops) -> None:
    """Run a few tokens of both paths first so lazy kernel set-up is not timed."""
    short = ids[:, -8:]
    generate_autoregressive(pair.target, short, max_new_tokens=4, stop_token_ids=stops)
    run_speculative(pair, short, _Limited(args, 2 * pair.drafter.config.block_size), stops)


class _Limited:
    def __init__(self, args, max_new_tokens):
        self.__dict__.update(vars(args))
        self.max_new_tokens = max_new_tokens
        self.temperature, self.top_p, self.top_k = 0.0, 1.0, 0


def run(args) -> int:
    apply_threads(args.threads)
    SamplingParams(args.temperature, args.top_p, args.top_k)  # validate before loading models
    text = read_prompt(args.prompt, args.prompt_file)
    pair = load_pair(args.target, args.drafter, args.dtype, args.device, args.drafter_backend, args.threads)
    for note in pair.notes:
        print(f"note: {note}", file=sys.stderr)
    ids = encode(pair.tokenizer, text, args.device)
    stops = stop_token_ids(pair.target, pair.tokenizer)
    if args.compare_ar:
        warm_up(pair, ids, args, stops)
    printer = TextStream(pair.tokenizer) if args.stream and not args.json else None
    result = run_speculative(pair, ids, args, stops, printer.push if printer else None)
    if printer:
        printer.push([], final=True)
        print()
    report = {
        "text": pair.tokenizer.decode(result.tokens[0], skip_special_tokens=True),
        "tokens": result.tokens[0],
        "tau": round(result.tau, 4),
        "acceptance_lengths": result.acceptance_lengths[0],
        "tokens_per_s": round(result.tokens_per_s, 3),
        "finish_reason": result.finish_reasons[0],
    }
    if args.compare_ar:
        ar = generate_autoregressive(pair.target, ids, max_new_tokens=args.max_new_tokens,
                                     temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                     stop_token_ids=stops, seed=args.seed)
        report["ar_tokens_per_s"] = round(ar.tokens_per_s, 3)
        report["speedup"] = round(result.tokens_per_s / ar.tokens_per_s, 3) if ar.tokens_per_s else None
        report["matches_ar"] = result.tokens == ar.tokens if args.temperature == 0 else None
    if args.json:
        print_json(report)
    else:
        _print_human(report, printer is None)
    return 0


def _print_human(report: dict, print_text: bool) -> None:
    if print_text:
        print(report["text"])
    line = f"tau {report['tau']:.2f} | {report['tokens_per_s']:.1f} tok/s | {len(report['tokens'])} tokens"
    if "speedup" in report:
        line += f" | target alone {report['ar_tokens_per_s']:.1f} tok/s | speedup {report['speedup']:.2f}x"
        if report["matches_ar"] is not None:
            line += f" | identical to target alone: {'yes' if report['matches_ar'] else 'NO'}"
    print(line, file=sys.stderr)
