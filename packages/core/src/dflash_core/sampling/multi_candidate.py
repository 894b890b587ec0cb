"""Several sampled candidates for one position: drawn without replacement, accepted by recursive rejection.

A token tree (`decode.tree`) gives a node m children x_1..x_m, drawn from the drafter's q one after the
other without replacement: x_j ~ q_j, where q_1 = q and q_{j+1} is q_j with x_j removed, renormalised
(`draw_without_replacement`: the Gumbel-top-m trick, which has exactly that law). The target, with its
warped distribution p at the node, keeps at most one of them (`recursive_accept`, recursive rejection
sampling without replacement, Jeon et al. 2024):

    r_1 = p
    for j = 1..m:  keep x_j with probability min(1, r_j(x_j) / q_j(x_j)), and stop;
                   else r_{j+1} = max(0, r_j - q_j) / sum(max(0, r_j - q_j))
    none kept:     commit a draw from r_{m+1}

Why the committed token has law p, by induction from the last stage: at stage j, whatever x_1..x_{j-1}
were and given they were rejected, x_j is a draw from q_j (it was drawn after them, from q_j, and the
rejections depended only on them and their own coins). One speculative-sampling step with proposal
q_j and target r_j commits x_j with probability min(r_j(x), q_j(x)) and otherwise passes the token on to
a stage that produces r_{j+1} = (r_j - q_j)+ / Z; min(r_j, q_j) + Z * r_{j+1} = r_j, so stage j produces
r_j whenever stage j+1 produces r_{j+1}, and the last stage draws from r_{m+1} directly. Hence stage 1
produces r_1 = p. The number of children m may depend on anything but the draws at this node (the tree's
shape is fixed from q before any child is drawn). With one-hot q (greedy-style fixed candidates) the rule
reduces to: the target samples y ~ p and the child whose token is y, if any, is kept.
"""

from __future__ import annotations

from typing import Callable

import torch

AcceptRule = Callable[[torch.Tensor, torch.Tensor, list[int], torch.Generator | None], tuple[int | None, torch.Tensor]]


def draw_without_replacement(q: torch.Tensor, count: int, generator: torch.Generator | None) -> torch.Tensor:
    """[n, V] distributions -> [n, count] ids: per row, the first `count` draws of sampling without
    replacement from q (Gumbel-top-k: argsort of log q + Gumbel noise). `count` must not exceed any
    row's support (ids beyond it would have probability 0)."""
    uniform = torch.rand(q.shape, generator=generator, device=q.device, dtype=torch.float32)
    gumbel = -torch.log(-torch.log(uniform.clamp_min(1e-30)))
    return (torch.log(q.float()) + gumbel).topk(count, dim=-1).indices


def recursive_accept(p: torch.Tensor, q: torch.Tensor, candidates: list[int],
                     generator: torch.Generator | None) -> tuple[int | None, torch.Tensor]:
    """p, q [V] (the target's and the drafter's distributions at one node); candidates x_1..x_m drawn from q
    without replacement, in draw order. Returns (j, None) when x_j is kept, else (None, r_{m+1}): the
    distribution the node's token is then drawn from (see the module docstring)."""
    residual, proposal = p.float(), q.float().clone()
    uniforms = torch.rand(len(candidates), generator=generator, device=p.device).tolist()
    for j, token in enumerate(candidates):
        q_j = proposal / proposal.sum()
        if uniforms[j] * float(q_j[token]) < float(residual[token]):
            return j, None
        excess = (residual - q_j).clamp(min=0)
        total = float(excess.sum())
        # a zero excess means r_j <= q_j everywhere, i.e. r_j == q_j: rejecting had probability 0 (rounding)
        residual = excess / total if total > 0 else residual
        proposal[token] = 0.0
    return None, residual
