"""`dflash generate`: speculative decoding of one prompt, optionally side by side with the target alone."""

from __future__ import annotations

import sys

from dflash_core.decode.autoregressive import generate_autoregressive
from dflash_core.decode.loop import generate_stream
from dflash_core.loading import encode_prompt, load_pair, stop_token_ids
from dflash_core.decode.profiling import DecodeProfile
from dflash_core.sampling.tokens import SamplingParams
from dflash_core.decode.text_stream import TextStream
from dflash_core.decode.warmup import warm_up

from dflash_cli import flags
from dflash_cli.common import (add_draft_length_arg, add_runtime_args, apply_threads, chat_message, print_json, read_prompt,
                               tuning_for)


def add_parser(commands) -> None:
    p = commands.add_parser("generate", help="generate with a target and its DFlash drafter")
    p.add_argument("--target", required=True, help="Hugging Face target model directory (with tokenizer)")
    p.add_argument("--drafter", required=True,
                   help="drafter directory (published format), or with --drafter-backend onnxruntime a .onnx file "
                        "or a dflash-convert --to onnx directory")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="prompt text")
    source.add_argument("--prompt-file", help="file holding the prompt text")
    source.add_argument("--chat", metavar="MESSAGE",
                        help="a user message, sent through the tokenizer's chat template (the assistant's turn "
                             "opened; generation stops at the template's end of turn)")
    p.add_argument("--max-new-tokens", type=flags.integer(1), default=128)
    p.add_argument("--temperature", type=flags.number(0.0), default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=flags.top_p, default=1.0)
    p.add_argument("--top-k", type=flags.integer(0), default=0)
    p.add_argument("--seed", type=flags.seed, default=None, help="seed for sampling")
    p.add_argument("--stream", action="store_true", help="print text as it is committed")
    p.add_argument("--compare-ar", action="store_true", help="also run the target alone; report speedup and match")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--drafter-backend", choices=["torch", "onnxruntime"], default="torch",
                   help="run the drafter in torch (default) or its exported ONNX graph with ONNX Runtime")
    p.add_argument("--drafter-weights", choices=["auto", "plain", "fp16-packed", "bf16", "bf16-prepacked"],
                   default="auto",
                   help="how the torch drafter's matmuls read their weights while decoding: fp16-packed (FBGEMM, "
                        "fp32 arithmetic; fp32 on a CPU only), bf16 (copies multiplied natively; fp32 on a CPU "
                        "with AMX-BF16 or AVX512-BF16), bf16-prepacked (a bf16 drafter's weights reordered for "
                        "oneDNN once; the same bits), plain, or auto (default: bf16 where the CPU has it, else "
                        "fp16-packed where possible, each matmul measuring where it beats fp32; a bf16 drafter "
                        "prepacked where that measured faster)")
    add_draft_length_arg(p)
    add_runtime_args(p, default_dtype="auto", allow_auto=True)
    p.set_defaults(run=run)


def run(args) -> int:
    apply_threads(args.threads)
    params = SamplingParams(args.temperature, args.top_p, args.top_k)  # validate before loading models
    prompt = read_prompt(args.prompt, args.prompt_file) if args.chat is None else chat_message(args.chat)
    pair = load_pair(args.target, args.drafter, dtype=args.dtype, device=args.device, backend=args.drafter_backend,
                     threads=args.threads, drafter_weights=args.drafter_weights, tuning=tuning_for(args))
    ids = encode_prompt(pair.tokenizer, prompt, args.device)
    stops = stop_token_ids(pair.target, pair.tokenizer)
    sampling = {"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k, "seed": args.seed}
    profile = DecodeProfile()
    # the request is checked here, before anything is printed: bad input stays one line
    stream = generate_stream(pair.target, pair.drafter, ids, max_new_tokens=args.max_new_tokens, tuning=pair.tuning,
                             stop_token_ids=stops, draft_length=args.draft_length,
                             context_lookup=args.context_lookup, tree=args.tree, profile=profile, **sampling)
    for note in pair.notes:
        print(f"note: {note}", file=sys.stderr)
    if args.compare_ar:
        warm_up(pair.target, pair.drafter, ids, stops, pair.tuning)
    printer = TextStream(pair.tokenizer) if args.stream and not args.json else None
    for chunk in stream:
        if printer:
            printer.push(chunk[0])
    result = stream.result
    if printer:
        printer.push([], final=True)
        print()
    report = {
        "text": pair.tokenizer.decode(result.tokens[0], skip_special_tokens=True),
        "tokens": result.tokens[0],
        "tau": round(result.tau, 4),
        "acceptance_lengths": result.acceptance_lengths[0],
        "lookup_steps": profile.lookup_steps,
        "tokens_per_s": round(profile.tokens_per_s(result.num_new_tokens), 3),
        "finish_reason": result.finish_reasons[0],
    }
    if args.compare_ar:
        ar_profile = DecodeProfile()
        ar = generate_autoregressive(pair.target, ids, max_new_tokens=args.max_new_tokens, stop_token_ids=stops,
                                     profile=ar_profile, **sampling)
        ar_rate = ar_profile.tokens_per_s(ar.num_new_tokens)
        report["ar_tokens_per_s"] = round(ar_rate, 3)
        report["speedup"] = round(report["tokens_per_s"] / ar_rate, 3) if ar_rate else None
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
