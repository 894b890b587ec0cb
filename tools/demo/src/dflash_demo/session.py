"""`dflash demo`: stream a held-out completion with DFlash, then measure it against the target alone and
Hugging Face prompt lookup (one closing line), and DFlash against the target alone over several prompts.

A completion prompt (text) streams until where a code-completion server would stop it: the end of the block
the prompt ends in (the first line indented no deeper than the prompt's last `def` / `class`, as Codex-style
stop sequences "\ndef", "\nclass" do), or --max-new-tokens. A chat prompt (`messages`, e.g. the code pair's
held-out set) goes through the tokenizer's chat template and streams the assistant's reply to its end of turn,
or --max-new-tokens. All three runs are then timed over exactly
those tokens, so the figures measure the method on the text a user would see, not on a loop past it."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from dflash_core.decode.autoregressive import generate_autoregressive
from dflash_core.decode.loop import generate, generate_stream
from dflash_core.errors import DFlashError
from dflash_core.dtypes import short_name
from dflash_core.loading import Pair, encode_prompt, load_pair, stop_token_ids
from dflash_core.decode.profiling import DecodeProfile
from dflash_core.training.data import read_prompts
from dflash_core.decode.warmup import warm_up
from dflash_core.tuning.plan import Tuning

# The streamed held-out prompt: one the toy target completes without looping and with the same text in fp32 and
# bf16 (a codec's encoder class, 36 tokens to the end of the class; the drafter drafts it, not context lookup).
# Most of the toy's greedy completions of the 64 held-out prompts loop before their block ends (a 12.6M model
# trained on the stdlib); the summary over 24 prompts includes those.
DEMO_PROMPT = 31

# Printed when greedy outputs part in reduced precision; docs/benchmarks.md has the measurements.
ROUNDING_NOTE = ("note: in {dtype}, scoring 16 tokens at once and 1 token at a time round logits differently; where "
                 "the target's top two tokens tie within that rounding the two runs may pick differently "
                 "(fp32 outputs are identical; see docs/benchmarks.md, 'Greedy equality in bf16').")


@dataclass(frozen=True)
class DemoRequest:
    """What one demo run does (the flags of `dflash demo`, checked by the CLI)."""

    models: Path
    prompt_index: int | None = None
    """Which held-out prompt to stream (None: `DEMO_PROMPT` where the set has it, else the first)."""
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    summary_prompts: int = 24
    dtype: str = "auto"
    draft_length: int | str = "auto"
    context_lookup: bool = True
    tree: int | str | None = None
    device: str = "cpu"
    tuning: Tuning | None = None
    stop_at_block_end: bool = True
    """Stop a streamed completion (a text prompt) at the end of the block its prompt ends in (`block_end`)."""
    """Where this machine's measurements live (None: in memory for this run)."""

    @property
    def sampling(self) -> dict:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed}


def run_demo(request: DemoRequest) -> None:
    models = request.models
    missing = [part for part in ("target", "drafter") if not (models / part / "config.json").is_file()]
    if missing:
        raise DFlashError(f"no {' and no '.join(f'{part}/config.json' for part in missing)} in {models}: `make models` "
                          "builds the demo pair, `make code-model` the code pair's target (see README).")
    prompts = read_prompts(models / "heldout.jsonl")
    if request.prompt_index is None:  # the bundled completion set's chosen prompt; a chat set or fewer prompts: the first
        chosen = DEMO_PROMPT < len(prompts) and isinstance(prompts[DEMO_PROMPT], str)
        request = replace(request, prompt_index=DEMO_PROMPT if chosen else 0)
    if not 0 <= request.prompt_index < len(prompts):
        raise DFlashError(f"--prompt-index is {request.prompt_index}, expected 0..{len(prompts) - 1} "
                          f"({len(prompts)} prompts in {models / 'heldout.jsonl'}).")
    prompt = prompts[request.prompt_index]
    pair = load_pair(models / "target", models / "drafter", dtype=request.dtype, device=request.device,
                     tuning=request.tuning)
    dtype = short_name(pair.target.dtype)
    for note in pair.notes:
        print(f"note: {note}", file=sys.stderr)
    ids = encode_prompt(pair.tokenizer, prompt, request.device)
    stops = stop_token_ids(pair.target, pair.tokenizer)
    c = pair.drafter.config
    print(f"DFlash demo: {pair.target.num_layers}-layer {pair.target.model.config.model_type} target "
          f"({_params(pair.target.model)}M params) "
          f"+ {c.num_hidden_layers}-layer drafter, block {c.block_size}, {dtype}, {request.device}, "
          f"draft length {request.draft_length}, context lookup {'on' if request.context_lookup else 'off'}"
          f"{'' if request.tree is None else f', token tree {request.tree}'}",
          file=sys.stderr)
    print(f"held-out prompt #{request.prompt_index} ({ids.shape[1]} tokens):", file=sys.stderr)
    print(_shown(prompt), end="")
    warm_up(pair.target, pair.drafter, ids, stops, pair.tuning)
    streamed = _stream_one(pair, ids, stops, request, prompt)
    all_identical = streamed.identical
    if request.summary_prompts:
        all_identical &= _summary(pair, prompts[: request.summary_prompts], stops, request)
    if not all_identical and request.temperature == 0 and dtype != "fp32":
        print(ROUNDING_NOTE.format(dtype=dtype), file=sys.stderr)
    print(streamed.line(greedy=request.temperature == 0), file=sys.stderr)  # the demo's last line


@dataclass(frozen=True)
class StreamedPrompt:
    """The streamed prompt decoded three ways in this run: DFlash, the target alone, prompt lookup."""

    tokens: int
    tau: float
    drafter_steps: int
    lookup_steps: int
    steps: int
    dflash_tok_s: float
    target_tok_s: float
    lookup_tok_s: float
    dflash_parts_at: int | None  # the first new token where DFlash's output is not the target alone's (None: same)
    lookup_parts_at: int | None

    @property
    def dflash_identical(self) -> bool:
        return self.dflash_parts_at is None

    @property
    def lookup_identical(self) -> bool:
        return self.lookup_parts_at is None

    @property
    def identical(self) -> bool:
        return self.dflash_identical and self.lookup_identical

    def line(self, *, greedy: bool) -> str:
        d, t, p = self.dflash_tok_s, self.target_tok_s, self.lookup_tok_s
        plain = self.steps - self.drafter_steps - self.lookup_steps
        sources = (f"{self.steps} steps: {self.drafter_steps} drafter, {self.lookup_steps} context lookup, "
                   f"{plain} plain")
        text = (f"this prompt: {self.tokens} tokens | DFlash {d:.1f} tok/s (tau {self.tau:.2f}; {sources}) | target alone "
                f"{t:.1f} tok/s | prompt lookup {p:.1f} tok/s | DFlash {d / t:.2f}x the target alone and "
                f"{d / p:.2f}x prompt lookup (prompt lookup {p / t:.2f}x)")
        if greedy:
            same = "yes" if self.identical else (f"DFlash {_parts(self.dflash_parts_at)}, "
                                                 f"prompt lookup {_parts(self.lookup_parts_at)}")
            text += f" | identical to target alone: {same}"
            if not self.identical:
                text += " (after a difference each run writes its own text: the speeds compare different texts)"
        return text


def _parts(position: int | None) -> str:
    return "yes" if position is None else f"NO (from new token {position})"


def block_end(prompt: str, completion: str) -> int | None:
    """Where `completion` leaves the block it is writing: the index of its first non-blank line indented no deeper
    than that block's header (the prompt's last `def` / `class` line, or the completion's first line where that is
    shallower: a completion that starts a new definition ends with it), once the block has a line of body
    (None: not yet, or the prompt has no such line)."""
    headers = re.findall(r"^([ \t]*)(?:async def|def|class)\b", prompt, re.M)
    if not headers:
        return None
    depth, start, body = len(headers[-1].expandtabs()), 0, None
    for line in completion.split("\n")[:-1]:  # complete lines only: the last may still grow
        indent = len(line.expandtabs()) - len(line.expandtabs().lstrip())
        if line.strip():
            if body is None:  # the first line of the completion
                depth, body = min(depth, indent), indent > min(depth, indent)
            elif body and indent <= depth:
                return start
            else:
                body = body or indent > depth
        start += len(line) + 1
    return None


def _shown(prompt: str | list[dict]) -> str:
    """The prompt as the demo prints it before the streamed reply: a completion prompt as it is; a chat as its
    turns, one `role: content` each, then `assistant: ` (the reply follows)."""
    if isinstance(prompt, str):
        return prompt
    return "".join(f"{m['role']}: {m['content']}\n" for m in prompt) + "assistant: "


def _tokens_before(tokenizer, tokens: list[int], end: int) -> int:
    """How many of `tokens` decode to text within the first `end` characters."""
    n = len(tokens)
    while n and len(tokenizer.decode(tokens[:n])) > end:
        n -= 1
    return n


def _stream_one(pair: Pair, ids, stops: list[int], request: DemoRequest, prompt: str | list[dict]) -> StreamedPrompt:
    """Stream DFlash's completion to the end of its block, then time DFlash, the target alone and prompt lookup
    over exactly those tokens on the same prompt."""
    from dflash_bench.methods import DecodeSettings, PromptBatch, first_difference, run_prompt_lookup

    bold = sys.stdout.isatty()
    sys.stdout.write("\033[1m") if bold else None
    tokens: list[int] = []
    printed = 0  # characters of the completion written so far: whole lines, so a cut never takes back text
    stream = generate_stream(pair.target, pair.drafter, ids, max_new_tokens=request.max_new_tokens, tuning=pair.tuning,
                             stop_token_ids=stops, draft_length=request.draft_length,
                             context_lookup=request.context_lookup, tree=request.tree, **request.sampling)
    end = None
    for chunk in stream:
        tokens += chunk[0]
        text = pair.tokenizer.decode(tokens)
        end = block_end(prompt, text) if request.stop_at_block_end and isinstance(prompt, str) else None
        upto = end if end is not None else text.rfind("\n") + 1
        sys.stdout.write(text[printed:upto])
        sys.stdout.flush()
        printed = max(printed, upto)
        if end is not None:
            tokens = tokens[: _tokens_before(pair.tokenizer, tokens, end)]
            break
    if end is None:
        sys.stdout.write(pair.tokenizer.decode(tokens)[printed:])
    sys.stdout.write("\033[0m\n") if bold else print()
    count = max(1, len(tokens))
    settings = DecodeSettings(count, tuple(stops), **request.sampling)
    batch = PromptBatch.of(ids.tolist(), [request.prompt_index], pad_id=0, device=request.device)
    run_prompt_lookup(pair, batch, replace(settings, max_new_tokens=8))  # warm-up, untimed
    profile = DecodeProfile()
    result = generate(pair.target, pair.drafter, ids, max_new_tokens=count, tuning=pair.tuning, stop_token_ids=stops,
                      draft_length=request.draft_length, context_lookup=request.context_lookup, tree=request.tree,
                      profile=profile, **request.sampling)
    ar_profile = DecodeProfile()
    ar = generate_autoregressive(pair.target, ids, max_new_tokens=count, stop_token_ids=stops, profile=ar_profile,
                                 **request.sampling)
    lookup = run_prompt_lookup(pair, batch, settings)
    return StreamedPrompt(tokens=len(result.tokens[0]), tau=result.tau, drafter_steps=profile.drafter_steps,
                          lookup_steps=profile.lookup_steps, steps=len(result.acceptance_lengths[0]),
                          dflash_tok_s=profile.tokens_per_s(result.num_new_tokens),
                          target_tok_s=ar_profile.tokens_per_s(ar.num_new_tokens),
                          lookup_tok_s=len(lookup.tokens[0]) / lookup.seconds,
                          dflash_parts_at=first_difference(ar.tokens[0], result.tokens[0]),
                          lookup_parts_at=first_difference(ar.tokens[0], lookup.tokens[0]))


def _summary(pair: Pair, prompts: list[str], stops: list[int], request: DemoRequest) -> bool:
    """DFlash and the target alone on several held-out prompts, interleaved in this run; True if all identical."""
    from dflash_bench.e2e import compare, encode_prompts, summarize
    from dflash_bench.methods import RUNNERS, DecodeSettings, run_dflash

    settings = DecodeSettings(request.max_new_tokens, tuple(stops), **request.sampling)
    runners = {**RUNNERS, "dflash": partial(run_dflash, draft_length=request.draft_length,
                                            context_lookup=request.context_lookup, tree=request.tree)}
    comparison = compare(pair, encode_prompts(pair, prompts, request.device), settings, methods=("ar", "dflash"),
                         runners=runners, label="held-out prompts")
    ar, spec = summarize(comparison)
    line = (f"{len(prompts)} held-out prompts: tau {spec['tau']:.2f} | DFlash {spec['tok_s']:.1f} tok/s | "
            f"target alone {ar['tok_s']:.1f} tok/s | speedup {spec['speedup']:.2f}x")
    if request.temperature == 0:
        line += f" | identical to target alone: {spec['identical']}"
    print(line, file=sys.stderr)
    return not comparison.mismatches


def _params(model) -> str:
    return f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}"
