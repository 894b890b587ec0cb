"""The sampling tau ceiling of a block-parallel drafter: what a drafter that had learnt its training objective
exactly would accept at temperature T > 0, measured on the target alone.

Why: a DFlash drafter proposes the B-1 positions of a block in one pass, each from its own distribution
q_j, without the tokens drawn before it. Trained with soft labels on the target's sampled continuations,
the best q_j it can learn is the marginal

    m_j(x) = E_{x_1..x_{j-1} ~ p}[ p(x | context, x_1..x_{j-1}) ],

and speculative sampling keeps draft j only as far as m_j overlaps p(. | the tokens actually kept). At
T = 0 the marginals are one-hot and the ceiling is the whole block; at T = 1 a high-entropy target spreads
them and the ceiling falls, whatever the drafter's size or training budget. It says how far a held-out
tau goal at T > 0 is reachable at all.

Estimated per context by Monte Carlo on the target:
- m_j from `samples` continuations of B-1 tokens, Rao-Blackwellised (the mean of their next-token
  distributions, not of one-hot counts); m_1 is the target's own distribution (its context is known);
- `chains` acceptance chains: from the context, position j is kept with probability
  a_j = sum_x min(p_j(x), m_j(x)) and the kept token follows min(p_j, m_j) / a_j (the law of a kept draft);
  tau = 1 + sum_j prod_{i<=j} a_i (the token the target adds after the kept drafts included, as
  `heldout_tau` counts it), averaged over chains, then contexts.
Contexts: each held-out prompt plus the first 0, stride, 2*stride, ... tokens of one sampled continuation
of the target's (seed = prompt index), the points where a decode at that temperature starts blocks.
A stop token is treated as any other token (the request's end is not modelled).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

import torch
from tqdm import tqdm

from dflash_core.sampling.tokens import SamplingParams, greedy_tokens, warp_logits
from dflash_core.target.adapter import cache_argument


def next_distributions(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The target's next-token law at `temperature`, warped as the decoder warps it (0: one-hot on the
    argmax), fp32 [..., V]."""
    if temperature == 0:
        return torch.nn.functional.one_hot(greedy_tokens(logits), logits.shape[-1]).float()
    return warp_logits(logits, SamplingParams(temperature=temperature)).softmax(dim=-1)


@torch.no_grad()
def rollout(model, context: torch.Tensor, *, width: int, steps: int, temperature: float,
            generator: torch.Generator, choose=None) -> tuple[torch.Tensor, torch.Tensor]:
    """`width` continuations of context [1, L], `steps` laws each: (tokens [width, steps-1], p [width, steps, V]),
    where p[:, j] is the law of token j+1 given the context and the row's tokens before it.

    `choose(j, p_j [width, V]) -> tokens [width]` picks each row's token j+1 (default: a sample of p_j).
    """
    from transformers import DynamicCache

    choose = choose or (lambda j, p: torch.multinomial(p, 1, generator=generator)[:, 0])
    cache = DynamicCache(config=model.config)
    with_cache = {cache_argument(model): cache, "use_cache": True}
    out = model(input_ids=context, **with_cache)
    cache.batch_repeat_interleave(width)
    laws = [next_distributions(out.logits[:, -1], temperature).expand(width, -1)]
    tokens = []
    for j in range(1, steps):
        tokens.append(choose(j - 1, laws[-1]))
        position = torch.full((width, 1), context.shape[1] + j - 1, dtype=torch.long)
        out = model(input_ids=tokens[-1][:, None], position_ids=position, **with_cache)
        laws.append(next_distributions(out.logits[:, -1], temperature))
    return torch.stack(tokens, dim=1) if tokens else context.new_zeros(width, 0), torch.stack(laws, dim=1)


def marginals(model, context: torch.Tensor, *, block_size: int, samples: int, temperature: float,
              generator: torch.Generator) -> torch.Tensor:
    """m [B-1, V]: each draft position's marginal law under the target (Rao-Blackwellised estimate)."""
    _, laws = rollout(model, context, width=samples, steps=block_size - 1, temperature=temperature,
                      generator=generator)
    return laws.mean(dim=0)


def chain_tau(model, context: torch.Tensor, marginal: torch.Tensor, *, chains: int, temperature: float,
              generator: torch.Generator) -> tuple[float, list[float]]:
    """For drafts drawn from `marginal` [B-1, V]: (expected tokens per full-block step, P(drafts 1..j all kept)
    for j = 1..B-1), means over `chains`."""
    kept = []  # a_j per chain, [chains] each

    def keep(j: int, p: torch.Tensor) -> torch.Tensor:
        overlap = torch.minimum(p, marginal[j])  # [chains, V]
        kept.append(overlap.sum(dim=-1))
        return torch.multinomial(overlap, 1, generator=generator)[:, 0]

    _, laws = rollout(model, context, width=chains, steps=marginal.shape[0], temperature=temperature,
                      generator=generator, choose=keep)
    keep(marginal.shape[0] - 1, laws[:, -1])  # the last position's acceptance (its token is not needed)
    survival = torch.stack(kept, dim=1).cumprod(dim=1).mean(dim=0)  # [B-1]: P(drafts 1..j all kept)
    return 1.0 + survival.sum().item(), survival.tolist()


def contexts_of(model, prompt: torch.Tensor, *, max_new_tokens: int, stride: int, temperature: float,
                seed: int) -> list[torch.Tensor]:
    """The prompt [1, L] plus the first 0, stride, ... (< max_new_tokens) tokens of one sampled continuation."""
    cuts = range(0, max_new_tokens, stride)
    tokens, _ = rollout(model, prompt, width=1, steps=cuts[-1] + 1, temperature=temperature,
                        generator=torch.Generator().manual_seed(seed))
    return [torch.cat([prompt, tokens[:, :cut]], dim=1) for cut in cuts]


def marginal_ceiling(model, prompts: Sequence[torch.Tensor], *, block_size: int, temperature: float, samples: int,
                     chains: int, max_new_tokens: int, stride: int, seed: int = 0) -> dict:
    """{"tau": the ceiling (mean over contexts), "per_prompt": [mean over that prompt's contexts],
    "kept_by_position": [P(drafts 1..j all kept), mean over contexts], "contexts_per_prompt"}."""
    per_prompt, survivals = [], []
    for i, prompt in enumerate(tqdm(prompts, desc=f"marginal ceiling T={temperature:g}", unit="prompt")):
        generator = torch.Generator().manual_seed(seed + i)
        taus = []
        for context in contexts_of(model, prompt, max_new_tokens=max_new_tokens, stride=stride,
                                   temperature=temperature, seed=seed + i):
            marginal = marginals(model, context, block_size=block_size, samples=samples, temperature=temperature,
                                 generator=generator)
            tau, survival = chain_tau(model, context, marginal, chains=chains, temperature=temperature,
                                      generator=generator)
            taus.append(tau)
            survivals.append(survival)
        per_prompt.append(sum(taus) / len(taus))
    kept = [round(sum(column) / len(survivals), 4) for column in zip(*survivals)]
    return {"tau": round(sum(per_prompt) / len(per_prompt), 3), "per_prompt": [round(t, 3) for t in per_prompt],
            "kept_by_position": kept, "contexts_per_prompt": len(range(0, max_new_tokens, stride))}


def main(argv: list[str] | None = None) -> int:
    """`python -m dflash_demo.marginal_ceiling`: the ceiling for a target into a JSON file (atomically)."""
    import json

    from dflash_core.files.atomic import write_json
    from dflash_core.loading import encode_prompt, load_target, load_tokenizer
    from dflash_core.training.data import read_prompts

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--prompts", type=Path, required=True, help="JSONL: `prompt` strings or `messages` chats")
    parser.add_argument("--count", type=int, default=16)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--samples", type=int, default=128, help="continuations per context for the marginals")
    parser.add_argument("--chains", type=int, default=128, help="acceptance chains per context")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--stride", type=int, default=32, help="tokens between a prompt's contexts")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    for name in ("count", "block_size", "samples", "chains", "max_new_tokens", "stride"):
        if getattr(args, name) < (2 if name == "block_size" else 1):
            parser.error(f"--{name.replace('_', '-')} is {getattr(args, name)}, expected a positive integer"
                         + (" >= 2" if name == "block_size" else ""))
    if not args.temperature >= 0:
        parser.error(f"--temperature is {args.temperature}, expected a number >= 0")
    torch.manual_seed(0)
    model = load_target(args.target, dtype="fp32").model
    tokenizer = load_tokenizer(args.target)
    prompts = [encode_prompt(tokenizer, text, "cpu") for text in read_prompts(args.prompts)[: args.count]]
    result = marginal_ceiling(model, prompts, block_size=args.block_size, temperature=args.temperature,
                              samples=args.samples, chains=args.chains, max_new_tokens=args.max_new_tokens,
                              stride=args.stride)
    settings = {k: getattr(args, k) for k in ("count", "block_size", "temperature", "samples", "chains",
                                               "max_new_tokens", "stride")}
    write_json(args.out, {"target": str(args.target), "prompts": str(args.prompts), **settings, **result})
    print(json.dumps({"tau": result["tau"], **settings}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
