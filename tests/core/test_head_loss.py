"""The fused head loss (`training.head_loss`) equals the unfused LM head + `block_loss` it replaces in training:
the loss, the gradient for the drafter's hidden states, and the argmax-equals-label flags, for hard, soft and
mixed labels, at T = 1 and T = 2, any chunk size, in fp32 and under bf16 autocast; and through
`TrainingObjective`, the drafter's gradients."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from tiny import drafter_config, tiny_drafter, tiny_target

from dflash_core import TargetModel
from dflash_core.training.batches import Batch
from dflash_core.training.head_loss import head_loss
from dflash_core.training.objective import (TrainingObjective, block_hidden, block_loss, labels_over_list,
                                            soft_label_kl, teacher_hidden_at_labels)

V, H, P = 48, 16, 40


def _case(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(P, H, generator=g)
    weight = torch.randn(V, H, generator=g)
    teacher = torch.randn(P, H, generator=g)
    labels = torch.randint(0, V, (P,), generator=g)
    share = torch.rand(P, generator=g)
    share[::7] = 0.0  # rows that do not count (padding, labels past the end)
    return hidden, weight, teacher, labels, share / share.sum()


def _unfused(hidden, weight, teacher, labels, a, b, temperature):
    """The objective's unfused form: logits, cross entropy and `soft_label_kl` over them, autograd's gradient."""
    hidden = hidden.clone().requires_grad_(True)
    logits = hidden @ weight.T
    loss = (a * F.cross_entropy(logits.float(), labels, reduction="none")).sum()
    if b.any():
        loss = loss + (b * soft_label_kl(logits, teacher @ weight.T, temperature)).sum()
    loss.backward()
    return loss.detach(), hidden.grad, logits.argmax(-1) == labels


def _fused(hidden, weight, teacher, labels, a, b, temperature, chunk):
    hidden = hidden.clone().requires_grad_(True)
    loss, correct = head_loss(hidden, weight, labels, a, b, teacher, temperature, chunk)
    (2.0 * loss).backward()  # the backward pass scales the kept gradient by the upstream one
    return loss.detach(), hidden.grad / 2.0, correct


@pytest.mark.parametrize("soft", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 2.0])
@pytest.mark.parametrize("chunk", [1, 7, 1000])
def test_fused_head_loss_equals_the_unfused_one_in_fp32(soft, temperature, chunk):
    hidden, weight, teacher, labels, share = _case()
    a, b = (1 - soft) * share, soft * share
    ref_loss, ref_grad, _ = _unfused(hidden, weight, teacher, labels, a, b, temperature)
    loss, grad, correct = _fused(hidden, weight, teacher, labels, a, b, temperature, chunk)
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(ref_loss.item(), rel=1e-5, abs=1e-6)
    assert (grad - ref_grad).abs().max().item() <= 1e-5 * ref_grad.abs().max().item()
    counted = share != 0
    assert torch.equal(correct[counted], ((hidden @ weight.T).argmax(-1) == labels)[counted])
    assert not correct[~counted].any() and not grad[~counted].any()  # skipped rows: no flag, no gradient


def test_fused_head_loss_under_bf16_autocast_runs_the_head_in_bf16_like_the_unfused_one():
    hidden, weight, teacher, labels, share = _case(1)
    weight = weight.to(torch.bfloat16)
    teacher = teacher.to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref_loss, ref_grad, ref_correct = _unfused(hidden, weight, teacher, labels, 0.5 * share, 0.5 * share, 1.0)
        loss, grad, correct = _fused(hidden, weight, teacher, labels, 0.5 * share, 0.5 * share, 1.0, 8)
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)
    # the same bf16 products; the fp32 gradient of the logits is summed in another order before its bf16 cast
    assert (grad - ref_grad).abs().max().item() <= 1e-2 * ref_grad.abs().max().item()
    counted = share != 0
    assert torch.equal(correct[counted], ref_correct[counted])


def test_fused_head_loss_refuses_a_trainable_head_and_soft_weights_without_a_teacher():
    hidden, weight, teacher, labels, share = _case()
    with pytest.raises(ValueError, match="must be frozen"):
        head_loss(hidden, weight.requires_grad_(True), labels, share, share * 0, None)
    with pytest.raises(ValueError, match="need the teacher's hidden states"):
        head_loss(hidden, weight.detach(), labels, share, share, None)


def _objective_pair():
    """A frozen tiny target (vocabulary 32, 4 layers) and a 1-layer, block-6 drafter fed by its layer 2."""
    model = tiny_target(vocab=32, layers=4, seed=3)
    model.requires_grad_(False)
    drafter = tiny_drafter(drafter_config(model, layers=1, block_size=6, layer_ids=(2,)), seed=3)
    return drafter, TargetModel(model, drafter.config.target_layer_ids)


def _assert_same_gradients(got: list[torch.Tensor], drafter) -> None:
    for mine, ref in zip(got, (p.grad for p in drafter.parameters()), strict=True):
        assert (mine - ref).abs().max().item() <= 1e-5 * max(1.0, ref.abs().max().item())


@pytest.mark.parametrize("distill_weight", [0.0, 0.5])
def test_the_training_objective_gives_the_unfused_loss_stats_and_drafter_gradients(distill_weight):
    drafter, target = _objective_pair()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 30, (2, 40), generator=g)
    valid = torch.ones_like(tokens, dtype=torch.bool)
    valid[1, 33:] = False
    anchors = torch.tensor([[5, 6, 20, 33], [0, 12, 13, 30]])
    target_pos = anchors[:, :, None] + torch.arange(1, 6)
    labels = tokens.gather(1, target_pos.clamp(max=39).flatten(1)).view_as(target_pos)
    label_valid = target_pos < torch.tensor([40, 33])[:, None, None]
    batch = Batch(tokens, valid, anchors, torch.ones_like(anchors, dtype=torch.bool), labels, label_valid)
    with torch.no_grad():
        out = target(tokens, torch.arange(40).expand(2, -1), None, valid.long())
    objective = TrainingObjective(drafter, target, gamma=3.0, soft_weight=distill_weight)
    loss, stats = objective(out.features, batch, out.hidden)
    loss.backward()
    fused_grads = [p.grad.clone() for p in drafter.parameters()]
    drafter.zero_grad(set_to_none=True)

    logits = target.logits(block_hidden(drafter, target, out.features, batch)[:, :, 1:])
    soft = soft_label_kl(logits, target.logits(teacher_hidden_at_labels(out.hidden, batch)), 1.0)
    ref_loss, ref_stats = block_loss(logits, batch, 3.0, soft, distill_weight)
    ref_loss.backward()
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5) and stats == pytest.approx(ref_stats)
    _assert_same_gradients(fused_grads, drafter)


def test_chunks_are_sized_by_bytes_small_on_the_cpu_large_elsewhere():
    from dflash_core.training.head_loss import rows_per_chunk

    assert rows_per_chunk(8192, torch.device("cpu")) == 128  # 4 MiB of fp32 logits: the demo vocabulary
    assert rows_per_chunk(151_936, torch.device("cpu")) == 6 and rows_per_chunk(10**9, torch.device("cpu")) == 1
    assert rows_per_chunk(8192, torch.device("meta")) == 8192  # off the CPU: 256 MiB


def test_a_head_the_fused_loss_cannot_stand_in_for_keeps_the_unfused_path():
    """A head with a bias (or hooks) is called as it is: `plain_head_weight` is None and the objective's loss is
    `block_loss` over that head's own logits, bias included."""
    model = tiny_target(vocab=32, layers=4, seed=5)
    head = torch.nn.Linear(model.config.hidden_size, 32, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.uniform_(-2.0, 2.0, generator=torch.Generator().manual_seed(1))
    model.lm_head = head
    model.requires_grad_(False)
    drafter = tiny_drafter(drafter_config(model, layers=1, block_size=4, layer_ids=(2,)), seed=5)
    target = TargetModel(model, drafter.config.target_layer_ids)
    assert target.plain_head_weight() is None
    tokens = torch.randint(0, 30, (1, 24), generator=torch.Generator().manual_seed(2))
    anchors = torch.tensor([[3, 9, 15]])
    labels = tokens.gather(1, (anchors[:, :, None] + torch.arange(1, 4)).flatten(1)).view(1, 3, 3)
    batch = Batch(tokens, torch.ones_like(tokens, dtype=torch.bool), anchors, torch.ones(1, 3, dtype=torch.bool),
                  labels, torch.ones(1, 3, 3, dtype=torch.bool))
    with torch.no_grad():
        out = target(tokens, torch.arange(24)[None], None, torch.ones_like(tokens))
    loss, _ = TrainingObjective(drafter, target, gamma=2.0)(out.features, batch)
    with torch.no_grad():
        logits = head(block_hidden(drafter, target, out.features, batch)[:, :, 1:])
        assert loss.item() == pytest.approx(block_loss(logits, batch, 2.0)[0].item(), rel=1e-6)
        unbiased = logits - head.bias
        assert abs(block_loss(unbiased, batch, 2.0)[0].item() - loss.item()) > 1e-3  # the bias counted


def test_the_loss_over_a_read_out_list_equals_a_hand_computed_value():
    """Vocabulary 4, list [1, 3]: the softmax runs over those two logits only; a label outside the list leaves
    the loss (the decoder can never draft it) and ends the run of right drafts."""
    logits = torch.log(torch.tensor([[[[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]]]]))  # [1, 1, 2, 4]
    batch = Batch(torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 4, dtype=torch.bool),
                  torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1, dtype=torch.bool),
                  labels=torch.tensor([[[3, 2]]]), label_valid=torch.ones(1, 1, 2, dtype=torch.bool))
    position = torch.tensor([-1, 0, -1, 1])  # id 1 -> 0, id 3 -> 1
    listed = labels_over_list(batch, position)
    assert listed.labels.tolist() == [[[1, 0]]] and listed.label_valid.tolist() == [[[True, False]]]
    loss, stats = block_loss(logits[..., [1, 3]], listed, gamma=1.0)
    # label 3 over {1: 0.2, 3: 0.4}: -ln(0.4 / 0.6) = ln 1.5; label 2 is outside the list: no term
    assert loss.item() == pytest.approx(math.log(1.5), abs=1e-6)
    assert stats["acc1"] == 1.0  # 3 is the argmax over the list (over all four ids too)


@pytest.mark.parametrize("distill_weight", [0.0, 0.5])
def test_the_objective_over_a_read_out_list_is_the_unfused_loss_over_those_rows(distill_weight):
    """`TrainingObjective(loss_ids=...)`, fused, equals the unfused loss over the listed logits with the labels
    mapped by hand (labels outside the list dropped), with the same drafter gradients; a list cuts the loss."""
    drafter, target = _objective_pair()
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 30, (2, 40), generator=g)
    valid = torch.ones_like(tokens, dtype=torch.bool)
    anchors = torch.tensor([[5, 6, 20, 30], [0, 12, 13, 30]])
    target_pos = anchors[:, :, None] + torch.arange(1, 6)
    labels = tokens.gather(1, target_pos.flatten(1)).view_as(target_pos)
    batch = Batch(tokens, valid, anchors, torch.ones_like(anchors, dtype=torch.bool), labels,
                  torch.ones_like(labels, dtype=torch.bool))
    ids = sorted(set(labels.flatten().tolist()))[::2]  # every other label id: many labels fall outside
    with torch.no_grad():
        out = target(tokens, torch.arange(40).expand(2, -1), None, valid.long())
    objective = TrainingObjective(drafter, target, gamma=3.0, soft_weight=distill_weight, loss_ids=ids)
    loss, stats = objective(out.features, batch, out.hidden)
    loss.backward()
    fused_grads = [p.grad.clone() for p in drafter.parameters()]
    drafter.zero_grad(set_to_none=True)

    by_hand = torch.tensor([[[ids.index(t) if t in ids else 0 for t in row] for row in seq] for seq in labels.tolist()])
    inside = torch.tensor([[[t in ids for t in row] for row in seq] for seq in labels.tolist()])
    assert 0 < int(inside.sum()) < inside.numel()
    mapped = Batch(tokens, valid, anchors, batch.anchor_valid, by_hand, inside)
    logits = target.logits(block_hidden(drafter, target, out.features, batch)[:, :, 1:])[..., ids]
    teacher = target.logits(teacher_hidden_at_labels(out.hidden, batch))[..., ids]
    ref_loss, ref_stats = block_loss(logits, mapped, 3.0, soft_label_kl(logits, teacher, 1.0), distill_weight)
    ref_loss.backward()
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5) and stats == pytest.approx(ref_stats)
    _assert_same_gradients(fused_grads, drafter)
    whole, _ = TrainingObjective(drafter, target, gamma=3.0, soft_weight=distill_weight)(out.features, batch,
                                                                                         out.hidden)
    assert abs(whole.item() - loss.item()) > 1e-3  # the list changes the loss: the test sees which one ran
