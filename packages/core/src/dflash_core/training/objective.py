"""The training objective: many blocks per sequence in one pass, position-decayed cross entropy.

Keys are [target context | blocks]; each block sees the context strictly before its anchor and
itself (`masks.block_attention_mask`, the same function inference uses). Blocks are attended in
groups of `ANCHOR_GROUP`, folded into the batch axis, so a step's cost stays linear in the number
of anchors (one attention over all N blocks would grow as N^2). Block position k
(1..B-1) predicts the token k after the anchor, with weight exp(-(k-1)/gamma): early positions
matter most, because a draft is only accepted up to its first mistake.

Labels are hard (the data's token at anchor + k), soft (the target's full next-token distribution
for that position: its LM head over its own final hidden state at anchor + k - 1, which the training
step's target forward already computed) or a mix `(1-W)*hard + W*soft`. The soft term is the same
position-weighted mean of T^2 * KL(p_target || p_drafter), both distributions at temperature T.

With a plain, frozen LM head (a bias-free nn.Linear, as most Hugging Face causal LMs have) the head and loss run fused,
chunk by chunk (`head_loss`): the same loss and gradients without the [positions, vocabulary] logits.

With a read-out list (`loss_ids`, `dflash train --loss-vocab list`) both distributions are softmaxes over the
listed rows of the head only: the drafter learns the argmax greedy decoding takes over that list, and a label
outside it (a draft the decoder can never propose) leaves the loss and ends the acceptance estimate's run.
The head's arithmetic shrinks by V / N (SmolLM2: 49,152 -> 4,288 rows), most of a step for a large vocabulary.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from dflash_core.model import graph
from dflash_core.model.drafter import Drafter
from dflash_core.model.masks import block_attention_mask
from dflash_core.target.adapter import TargetModel
from dflash_core.training.batches import Batch
from dflash_core.training.head_loss import head_loss


def position_weights(block_size: int, gamma: float, device=None) -> torch.Tensor:
    """w_k = exp(-(k-1)/gamma) for k = 1..B-1: [B-1]."""
    k = torch.arange(1, block_size, device=device, dtype=torch.float32)
    return torch.exp(-(k - 1) / gamma)


# Blocks per attention group. A group's queries attend over [context | the group's own blocks] only, so
# a step costs O(N*Q * (C + ANCHOR_GROUP*Q)), linear in the anchor count N, where one group of all N
# blocks costs O(N*Q * (C + N*Q)). Blocks never see one another, so grouping changes no value (up to
# float rounding); 64 >= the demo recipe's 48 anchors, which therefore run exactly as before.
ANCHOR_GROUP = 64


def block_hidden(drafter: Drafter, target: TargetModel, features: torch.Tensor, batch: Batch,
                 group: int | None = ANCHOR_GROUP) -> torch.Tensor:
    """Drafter outputs for every block: [B, N, Q, H]; `group` blocks share one attention (None: all N)."""
    block = drafter.config.block_size
    b, n = batch.anchors.shape
    w = drafter.weights()
    ctx_pos = torch.arange(features.shape[1], device=features.device).expand(b, -1)
    ctx_k, ctx_v = graph.inject_context(w, drafter.dims, features, ctx_pos)  # [L, B, g, C, d]
    anchors, valid = batch.anchors, batch.valid
    anchor_tokens = batch.tokens.gather(1, anchors)  # [B, N]
    groups = 1 if group is None or n <= group else -(-n // group)
    if groups > 1:  # fold groups into the batch axis: row r*groups + j holds blocks j*group.. of row r
        pad = groups * group - n  # padding blocks (anchor 0) are computed and dropped below
        anchors = F.pad(anchors, (0, pad)).reshape(b * groups, group)
        anchor_tokens = F.pad(anchor_tokens, (0, pad)).reshape(b * groups, group)
        valid = valid.repeat_interleave(groups, dim=0)
        ctx_pos = ctx_pos[:1].expand(b * groups, -1)
        ctx_k, ctx_v = ctx_k.repeat_interleave(groups, dim=1), ctx_v.repeat_interleave(groups, dim=1)
    rows, per_row = anchors.shape
    offsets = torch.arange(block, device=features.device)
    block_pos = (anchors[:, :, None] + offsets).reshape(rows, per_row * block)  # [rows, per_row*Q]
    block_ids = torch.full((rows, per_row, block), drafter.config.mask_token_id, device=features.device,
                           dtype=torch.long)
    block_ids[:, :, 0] = anchor_tokens
    with torch.no_grad():
        noise = target.embed(block_ids.view(rows, per_row * block))
    masks = {window: block_attention_mask(ctx_pos, valid, anchors, block, window)
             for window in set(drafter.dims.windows)}
    hidden = graph.draft_forward(w, drafter.dims, noise.to(features.dtype), block_pos, ctx_k, ctx_v,
                                 [masks[window] for window in drafter.dims.windows])
    return hidden.view(b, groups * per_row, block, -1)[:, :n]


# teacher positions per LM-head call: bounds the fp32 [positions, V] teacher logits held at once
TEACHER_CHUNK = 2048


def teacher_hidden_at_labels(hidden: torch.Tensor, batch: Batch) -> torch.Tensor:
    """The target's final hidden state that predicts each label: position anchor + k - 1 for k = 1..Q-1.

    hidden [B, T, H] -> [B, N, Q-1, H] (padding positions are clamped; their labels are masked out).
    """
    b, n, labels = batch.labels.shape
    pos = (batch.anchors[:, :, None] + torch.arange(labels, device=hidden.device)).clamp(max=hidden.shape[1] - 1)
    index = pos.view(b, n * labels, 1).expand(-1, -1, hidden.shape[-1])
    return hidden.gather(1, index).view(b, n, labels, -1)


def soft_label_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """T^2 * KL(softmax(teacher/T) || softmax(student/T)) per position: [..., V] x2 -> [...] (fp32).

    The T^2 factor keeps the gradient's scale independent of T (as in knowledge distillation).
    """
    log_p = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    log_q = F.log_softmax(student_logits.float() / temperature, dim=-1)
    return temperature**2 * (log_p.exp() * (log_p - log_q)).sum(-1)


def teacher_kl(student_logits: torch.Tensor, teacher_hidden: torch.Tensor, lm_head, temperature: float,
               chunk: int = TEACHER_CHUNK) -> torch.Tensor:
    """`soft_label_kl` against lm_head(teacher_hidden), the teacher's logits made `chunk` positions at a time.

    student_logits [..., V], teacher_hidden [..., H] -> [...]. Gradients flow to the student only.
    """
    student = student_logits.flatten(0, -2)
    teacher = teacher_hidden.flatten(0, -2)
    parts = []
    for start in range(0, student.shape[0], chunk):
        with torch.no_grad():
            teacher_logits = lm_head(teacher[start:start + chunk])
        parts.append(soft_label_kl(student[start:start + chunk], teacher_logits, temperature))
    return torch.cat(parts).view(student_logits.shape[:-1])


def tokens_per_step(committed: torch.Tensor, valid: torch.Tensor) -> float:
    """Tokens a verify step commits, estimated from teacher-forced blocks at random anchors.

    committed [B, N]: 1 + the leading drafts whose argmax equals the label, per anchor; valid [B, N].
    Decoding visits positions as a chain (a step that commits L tokens skips the next L - 1 anchors),
    so tau = tokens / steps, and a position's share of a step is about 1/committed: the harmonic mean
    over anchors. The plain mean over-weights repetitive stretches, where every anchor commits a whole
    block. Measured with the 2,250-step demo drafter on 16 held-out prompts, every position an anchor:
    plain mean 4.49, harmonic mean 1.69, the decoder's own 2.00 tokens per step (the harmonic mean
    reads low because later anchors inside one accepted run commit less than the run's first).
    """
    share = (1.0 / committed.float()) * valid
    return valid.sum().item() / max(share.sum().item(), 1e-9)


def label_weights(batch: Batch, gamma: float) -> torch.Tensor:
    """Each label's share of the loss: w_k * label_valid / sum(w_k * label_valid), [B, N, Q-1] fp32."""
    w = position_weights(batch.labels.shape[2] + 1, gamma, batch.labels.device) * batch.label_valid
    return w / w.sum().clamp(min=1e-6)


def committed_per_anchor(correct: torch.Tensor, batch: Batch) -> torch.Tensor:
    """correct [B, N, Q-1] (argmax == label) -> [B, N]: 1 + the leading valid drafts equal to the label."""
    return (correct & batch.label_valid).long().cumprod(dim=-1).sum(dim=-1) + 1


def acceptance_stats(correct: torch.Tensor, batch: Batch) -> dict:
    """correct [B, N, Q-1] (argmax == label) -> the running estimate `tau_est` (`tokens_per_step`) and acc1."""
    correct = correct & batch.label_valid
    return {"tau_est": tokens_per_step(committed_per_anchor(correct, batch), batch.anchor_valid),
            "acc1": (correct[..., 0].sum() / batch.label_valid[..., 0].sum().clamp(min=1)).item()}


def block_loss(logits: torch.Tensor, batch: Batch, gamma: float, soft: torch.Tensor | None = None,
               soft_weight: float = 0.0) -> tuple[torch.Tensor, dict]:
    """Weighted loss over block positions 1..Q-1 and a running acceptance estimate (the unfused form).

    logits [B, N, Q-1, V]; soft [B, N, Q-1] the per-position soft-label term (needed when soft_weight > 0).
    loss = (1 - soft_weight) * mean_w(cross entropy vs labels) + soft_weight * mean_w(soft), with
    mean_w the mean weighted by w_k * label_valid (`label_weights`). `head_loss` computes the same in one pass.
    """
    w = label_weights(batch, gamma)
    loss = logits.new_zeros((), dtype=torch.float32)
    if soft_weight < 1:
        ce = F.cross_entropy(logits.float().flatten(0, 2), batch.labels.flatten(), reduction="none")
        loss = (ce.view_as(batch.labels) * w).sum()
        if soft_weight > 0:
            loss = (1 - soft_weight) * loss
    if soft_weight > 0:
        if soft is None:
            raise ValueError("block_loss: soft_weight > 0 needs the per-position soft term [B, N, Q-1]")
        loss = loss + soft_weight * (torch.where(batch.label_valid, soft, 0.0) * w).sum()
    with torch.no_grad():
        stats = acceptance_stats(logits.argmax(-1) == batch.labels, batch)
    return loss, stats


def labels_over_list(batch: Batch, position: torch.Tensor) -> Batch:
    """The batch with labels as indices into a read-out list; labels outside it become invalid.

    position [V] long: the list index of each token id, -1 for ids outside the list.
    """
    listed = position[batch.labels]  # [B, N, Q-1]
    inside = listed >= 0
    return replace(batch, labels=listed.clamp(min=0), label_valid=batch.label_valid & inside)


class TrainingObjective(nn.Module):
    """Wraps the drafter so DistributedDataParallel sees one forward per micro-batch."""

    def __init__(self, drafter: Drafter, target: TargetModel, gamma: float, soft_weight: float = 0.0,
                 temperature: float = 1.0, loss_ids: list[int] | None = None) -> None:
        super().__init__()
        self.drafter = drafter
        self._target = [target]  # a list: the frozen target is not a submodule (DDP must not sync it)
        self.gamma = gamma
        self.soft_weight = soft_weight
        self.temperature = temperature
        # the read-out list the loss runs over (None: the whole vocabulary): its ids [N] and each id's index [V]
        self.loss_ids = self.list_position = None
        self._listed_head: tuple[tuple, torch.Tensor] | None = None  # (the head it was cut from, its rows [N, H])
        if loss_ids is not None:
            device = next(drafter.parameters()).device
            self.loss_ids = torch.tensor(sorted(loss_ids), dtype=torch.long, device=device)
            self.list_position = torch.full((target.vocab_size,), -1, dtype=torch.long, device=device)
            self.list_position[self.loss_ids] = torch.arange(len(loss_ids), device=device)

    def forward(self, features: torch.Tensor, batch: Batch,
                target_hidden: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
        """features [B, T, n*H]; target_hidden [B, T, H] the target's final hidden states (soft labels only)."""
        target = self._target[0]
        hidden = block_hidden(self.drafter, target, features, batch)  # [B, N, Q, H]
        if self.soft_weight > 0 and target_hidden is None:
            raise ValueError("soft labels need the target's final hidden states [B, T, H] (target_hidden)")
        teacher = None if self.soft_weight == 0 else teacher_hidden_at_labels(target_hidden, batch)  # [B, N, Q-1, H]
        if self.loss_ids is not None:
            batch = labels_over_list(batch, self.list_position)
        head = target.plain_head_weight()
        if head is not None and not head.requires_grad:
            return self._fused_loss(hidden, self._rows_of(head), batch, teacher)
        lm_head = target.logits if self.loss_ids is None else (lambda h: target.logits(h)[..., self.loss_ids])
        logits = lm_head(hidden[:, :, 1:])  # frozen head; gradients flow to the drafter only
        soft = None if teacher is None else teacher_kl(logits, teacher, lm_head, self.temperature)
        return block_loss(logits, batch, self.gamma, soft, self.soft_weight)

    def _rows_of(self, head: torch.Tensor) -> torch.Tensor:
        """The head's rows the loss runs over: all of them, or the read-out list's (cut once per head weight)."""
        if self.loss_ids is None:
            return head
        key = (head.data_ptr(), head._version, head.dtype)
        if self._listed_head is None or self._listed_head[0] != key:
            self._listed_head = (key, head.index_select(0, self.loss_ids))
        return self._listed_head[1]

    def _fused_loss(self, hidden: torch.Tensor, head: torch.Tensor, batch: Batch,
                    teacher: torch.Tensor | None) -> tuple[torch.Tensor, dict]:
        """`block_loss` over `head`'s logits, computed by `head_loss` without the [P, V] logits; teacher
        [B, N, Q-1, H] the target's hidden states behind the soft labels (None: hard labels only)."""
        w = label_weights(batch, self.gamma).flatten()  # [P], P = B*N*(Q-1)
        teacher = None if teacher is None else teacher.flatten(0, 2)  # [P, H]
        loss, correct = head_loss(hidden[:, :, 1:].flatten(0, 2), head, batch.labels.flatten(),
                                  (1 - self.soft_weight) * w, self.soft_weight * w, teacher, self.temperature)
        return loss, acceptance_stats(correct.view_as(batch.labels), batch)
