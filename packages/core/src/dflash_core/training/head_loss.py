"""The frozen LM head and the block loss in one pass over row chunks, gradients made on the way.

The unfused objective materialises the drafter's logits for every block position ([P, V], P = batch x
anchors x 15, V the target's vocabulary: 5,760 x 8,192 for the demo recipe, 189 MB in fp32), a float
copy, the teacher's logits, and several log-softmax, division, exponential and product passes over
them, forward and backward. On a 2-core CPU that element-wise traffic, not the head's matmul, was most
of a training step (docs/training.md, "A training step's loss in one pass"). Here each chunk of rows
makes its logits, its loss terms and d(loss)/d(logits) while they sit in cache, and keeps only the
gradient for the rows' hidden states ([P, H]); the backward pass scales it.

The loss is sum_i a_i * CE_i + b_i * KL_i over rows i, with
  CE_i = -log q_i[y_i]                                   q_i = softmax(s_i), s_i = h_i W^T
  KL_i = T^2 * sum_v p_iv (log p_iv - log q^T_iv)        p_i = softmax(t_i / T), q^T_i = softmax(s_i / T)
and d/ds_i = a_i (q_i - onehot(y_i)) + b_i T (q^T_i - p_i). The head W is frozen (no gradient).
Rows whose a_i and b_i are both zero (padding, labels past a sequence's end) are skipped.
"""

from __future__ import annotations

import torch

# Bytes of one fp32 [rows, V] temporary per chunk (logits, log-probabilities, gradient). On a CPU the chunk
# should stay near the core's cache: 4 MiB is 128 rows of the demo's 8,192-token vocabulary (64 and 128 rows
# measured alike there, 256 and more slower: docs/training.md, same section); a GPU wants few, large launches.
CPU_CHUNK_BYTES = 4 << 20
GPU_CHUNK_BYTES = 256 << 20


def rows_per_chunk(vocab: int, device: torch.device) -> int:
    """Rows per chunk: a [rows, vocab] fp32 temporary of about CPU_CHUNK_BYTES (GPU_CHUNK_BYTES off the CPU)."""
    budget = CPU_CHUNK_BYTES if device.type == "cpu" else GPU_CHUNK_BYTES
    return max(1, budget // (4 * vocab))


def compute_dtype(hidden: torch.Tensor) -> torch.dtype:
    """The dtype the head's matmul runs in: autocast's where autocast is on (as the unfused head), else hidden's."""
    device = hidden.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype


class _HeadLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, hard_weight, soft_weight, teacher, temperature, chunk, dtype):
        rows = (hard_weight != 0) | (soft_weight != 0)
        index = rows.nonzero().squeeze(1)  # [R] the rows that count
        wanted = ctx.needs_input_grad[0]
        grad = torch.zeros_like(hidden) if wanted else None
        correct = torch.zeros(hidden.shape[0], dtype=torch.bool, device=hidden.device)
        total = torch.zeros((), dtype=torch.float64, device=hidden.device)
        head = weight.to(dtype)
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, index.numel(), chunk):
                at = index[start:start + chunk]
                loss, part, right = _chunk(hidden[at], head, labels[at], hard_weight[at], soft_weight[at],
                                           None if teacher is None else teacher[at], temperature, dtype, wanted)
                total += loss
                correct[at] = right
                if wanted:
                    grad[at] = part.to(grad.dtype)
        ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(correct)
        return total.float(), correct

    @staticmethod
    def backward(ctx, grad_loss, _grad_correct):
        (grad,) = ctx.saved_tensors
        return grad * grad_loss.to(grad.dtype), None, None, None, None, None, None, None, None


def _chunk(hidden, head, labels, a, b, teacher, temperature, dtype, wanted):
    """One chunk of rows: (its loss, d loss / d hidden [c, H] or None, argmax == label [c])."""
    logits = (hidden.to(dtype) @ head.T).float()  # [c, V]
    right = logits.max(-1).indices == labels  # the first maximum, as argmax, in under half its time here
    log_q = logits.log_softmax(-1)
    loss = -(a * log_q.gather(1, labels[:, None]).squeeze(1)).sum()
    grad = log_q.exp().mul_(a[:, None]) if wanted else None  # a (q - onehot), the onehot below
    if teacher is not None:
        scaled = (teacher.to(dtype) @ head.T).float()  # the teacher's logits [c, V]
        if temperature != 1:
            scaled = scaled.div_(temperature)
            log_q = logits.div_(temperature).log_softmax(-1)
        log_p = scaled.log_softmax(-1)
        p = log_p.exp()
        loss = loss + temperature**2 * (b * (p * (log_p - log_q)).sum(-1)).sum()
        if wanted:
            grad = grad.add_(log_q.exp().sub_(p).mul_((b * temperature)[:, None]))
    if not wanted:
        return loss, None, right
    grad[torch.arange(labels.numel(), device=labels.device), labels] -= a
    return loss, grad.to(dtype) @ head, right


def head_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, hard_weight: torch.Tensor,
              soft_weight: torch.Tensor, teacher: torch.Tensor | None = None, temperature: float = 1.0,
              chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """sum_i a_i CE_i + b_i KL_i (fp32 scalar, differentiable in `hidden`) and argmax(s_i) == y_i per row.

    hidden [P, H] the drafter's outputs; weight [V, H] the frozen head; labels [P]; hard_weight (a) and
    soft_weight (b) [P] fp32; teacher [P, H] the target's hidden states behind the soft labels (needed
    when any b_i is non-zero). The matmuls run in `compute_dtype(hidden)`, the rest in fp32; `chunk` rows at a
    time (None: `rows_per_chunk`).
    """
    if weight.requires_grad:
        raise ValueError("head_loss: the LM head must be frozen (its weight gets no gradient here)")
    if teacher is None and bool((soft_weight != 0).any()):
        raise ValueError("head_loss: soft-label weights need the teacher's hidden states [P, H]")
    return _HeadLoss.apply(hidden, weight, labels, hard_weight.float(), soft_weight.float(), teacher,
                           float(temperature), chunk or rows_per_chunk(weight.shape[0], hidden.device),
                           compute_dtype(hidden))
