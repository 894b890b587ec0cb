"""Draft sources and verifiers plug into the decode loop from outside it; output stays the target's.

The loop (`dflash_core.decode.loop`) knows only the `DraftSource`, `SourceChooser` and `Verifier`
interfaces: here a source of this file's own ("always propose token 0") and a verifier that wraps the
built-in one decode through it unchanged.
"""

from __future__ import annotations

import torch
from dflash_core import DecodeProfile, generate, generate_autoregressive
from dflash_core.decode.choice import FixedChoice
from dflash_core.decode.sources import DraftSource, Proposal, StepInput, Verdict
from dflash_core.decode.verify import ChainVerifier
from tiny import drafter_config, tiny_drafter, tiny_target

PROMPTS = torch.tensor([[3, 5, 7, 9, 11, 13], [2, 4, 6, 8, 10, 12]])


class ZeroSource:
    """Proposes token 0 at every draft position: a source the library has never heard of."""

    name = "zeros"

    def __init__(self) -> None:
        self.rows, self.observed = None, []

    def propose(self, step: StepInput, k: int) -> Proposal:
        return Proposal(self.name, torch.zeros((step.last.shape[0], k), dtype=torch.long, device=step.last.device))

    def observe(self, proposal: Proposal | None, verdict: Verdict) -> None:
        self.observed.append(None if proposal is None else proposal.source)

    def select_rows(self, keep: list[int]) -> None:
        self.rows = keep


class CountingVerifier(ChainVerifier):
    """The built-in chain verifier, counting the drafts it was shown."""

    def __init__(self) -> None:
        super().__init__(*_greedy())
        self.drafts = 0

    def verify(self, target, cache, step, proposal):
        self.drafts += proposal.k * proposal.drafts.shape[0]
        return super().verify(target, cache, step, proposal)


def _greedy():
    from dflash_core.sampling.tokens import SamplingParams
    return SamplingParams(), None


def _pair(always_zero: bool = False):
    model = tiny_target(vocab=32, layers=2)
    if always_zero:  # every logit 0: the argmax is token 0, always
        with torch.no_grad():
            model.lm_head.weight.zero_()
    return model, tiny_drafter(drafter_config(model, block_size=6))


def test_a_source_of_your_own_decodes_losslessly_through_the_unchanged_loop():
    model, drafter = _pair()
    source, verifier = ZeroSource(), CountingVerifier()
    assert isinstance(source, DraftSource)
    plain = generate_autoregressive(model, PROMPTS, max_new_tokens=14, stop_token_ids=[31]).tokens
    profile = DecodeProfile(step_log=[])
    out = generate(model, drafter, PROMPTS, max_new_tokens=14, stop_token_ids=[31], chooser=FixedChoice(source, 3),
                   verifier=verifier, profile=profile)
    assert out.tokens == plain
    assert {r.source for r in profile.step_log} <= {"zeros", "plain"} and profile.step_log[0].source == "zeros"
    assert verifier.drafts > 0 and source.observed[0] is None and "zeros" in source.observed


def test_the_sources_drafts_are_what_the_target_accepts_where_it_agrees():
    model, drafter = _pair(always_zero=True)
    out = generate(model, drafter, PROMPTS[:1], max_new_tokens=13, chooser=FixedChoice(ZeroSource(), 3))
    assert out.tokens == [[0] * 13]
    assert out.acceptance_lengths[0][:3] == [4, 4, 4]  # 3 zeros accepted + the target's own 0, every step
    wrong = generate(*_pair(), PROMPTS[:1], max_new_tokens=13, chooser=FixedChoice(ZeroSource(), 3))
    assert wrong.tau < 2  # a random target rarely writes 0: the same source's drafts are rejected
