"""The DFlash drafter drafts its whole block in vLLM; the scheduled draft length decides how many drafts are verified.

vLLM 0.32 lays out the drafter's query block from the draft length it schedules this step
(`DFlashProposer.set_inputs_first_pass`: `num_query_per_req = 1 + self.num_speculative_tokens`, set by
`SpecDecodeBaseProposer.propose` from the scheduler's `num_spec_tokens_to_schedule`). A DFlash drafter
attends bidirectionally within the block it was trained on, so a shorter block changes its drafts: on
the demo pair (trained on blocks of 16), k = 3, 8 held-out prompts, greedy, 1.58 tokens per step from a
block of 4 against 2.46 from the first 3 drafts of the whole block (tests/plugins/test_vllm_serving.py). Dynamic speculative decoding
(`num_speculative_tokens_per_batch_size`) shrinks k exactly when verifying is dear, and got those worse drafts.

With this fix the drafter always drafts the block vLLM is configured for (`num_speculative_tokens`, the
drafter's block - 1 as `dflash serve` launches it) and only the first k of its drafts go to the sampler and
on to the verify. The slots the whole block writes in the drafter's KV cache are reserved for every step
(`VllmConfig.num_lookahead_tokens` = configured `num_speculative_tokens` + 1, however short the schedule), and
a step that schedules no drafts (k = 0) or the whole block is left as vLLM runs it. Lossless either way: the
target verifies what is proposed. `DFLASH_VLLM_SKIP_FIXES=whole-block` leaves it out.
"""

from __future__ import annotations

import os
from typing import Callable

from .cpu.patches import SKIP_ENV

NAME = "whole-block"


def drafts_whole_block(original: Callable) -> Callable:
    """DFlashProposer.set_inputs_first_pass laying out the configured block and sampling only its first k drafts."""

    def set_inputs_first_pass(self, *args, **kwargs):
        wanted = self.num_speculative_tokens  # this step's k (SpecDecodeBaseProposer.propose set it)
        block = self.speculative_config.num_speculative_tokens
        if wanted == 0 or wanted >= block:
            return original(self, *args, **kwargs)
        self.num_speculative_tokens = block
        try:
            num_tokens, token_indices_to_sample, cad = original(self, *args, **kwargs)
        finally:
            self.num_speculative_tokens = wanted
        first = token_indices_to_sample.view(-1, block)[:, :wanted].reshape(-1)
        return num_tokens, first, cad

    set_inputs_first_pass.dflash_vllm_fix = NAME
    return set_inputs_first_pass


# the vLLM lines it answers: the block laid out from the step's k, and that k set from the scheduler's
EVIDENCE = (("vllm.v1.spec_decode.dflash", "num_query_per_req = 1 + self.num_speculative_tokens"),
            ("vllm.v1.spec_decode.llm_base_proposer", "self.num_speculative_tokens = num_speculative_tokens"),
            ("vllm.config.vllm", "return self.num_speculative_tokens + 1"))


def register_whole_block() -> list[str]:
    """Install the fix on vLLM's DFlashProposer (every platform); the names installed."""
    if NAME in set(filter(None, os.environ.get(SKIP_ENV, "").split(","))):
        return []
    try:
        from vllm.v1.spec_decode.dflash import DFlashProposer
    except ImportError:  # a vLLM without DFlash: nothing to fix
        return []
    current = DFlashProposer.set_inputs_first_pass
    if getattr(current, "dflash_vllm_fix", None) != NAME:  # once per process
        DFlashProposer.set_inputs_first_pass = drafts_whole_block(current)
    return [NAME]
