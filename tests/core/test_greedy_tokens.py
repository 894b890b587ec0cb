"""The greedy choice: argmax over the vocabulary, the first index on ties, in every dtype and layout."""

from __future__ import annotations

import pytest
import torch

from dflash_core.sampling.tokens import greedy_tokens


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_first_maximal_index_in_every_layout(dtype):
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        # four distinct values over 257 ids: every row has many tied maxima
        logits = torch.randint(0, 4, (3, 5, 257), generator=generator).to(dtype)
        transposed = logits.transpose(-1, -2).contiguous().transpose(-1, -2)  # the LM head's other layout
        expected = torch.tensor([[[row.tolist().index(max(row.tolist())) for row in block] for block in logits]])[0]
        for view in (logits, transposed, logits[:, 1:]):
            got = greedy_tokens(view)
            assert got.dtype == torch.int64
            assert torch.equal(got, expected[:, 1:] if view.shape[1] == 4 else expected)
