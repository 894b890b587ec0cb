"""The sampler every sampled token goes through (`dflash_core.sampling.tokens.sample_categorical`): the target's
tokens, sampled drafts and the residual draw of speculative sampling."""

from collections import Counter

import pytest
import torch
from test_sampling_lossless import ALPHA, chi_square_p

from dflash_core.errors import GenerationError
from dflash_core.sampling.tokens import categorical_from_uniform, running_sum_dtype, sample_categorical

WEIGHTS = [0.0, 3.5, 0.0, 1.0, 2.5, 0.0, 0.5, 0.0]  # not normalised; zeros first, between and last
DRAWS = 40000


def _draws(weights: list[float], seed: int = 0) -> Counter:
    rows = torch.tensor([weights] * DRAWS, dtype=torch.float32)
    return Counter(sample_categorical(rows, torch.Generator().manual_seed(seed)).tolist())


def test_draws_follow_the_weights_and_never_take_a_zero_weight_index():
    counts = _draws(WEIGHTS)
    total = sum(WEIGHTS)
    assert chi_square_p(counts, {i: w / total for i, w in enumerate(WEIGHTS)}, DRAWS) > ALPHA
    assert all(counts[i] == 0 for i, w in enumerate(WEIGHTS) if w == 0)


def test_the_fit_test_rejects_other_weights():
    """The same draws scored against a nearby wrong distribution: the goodness-of-fit test can fail."""
    counts = _draws(WEIGHTS)
    wrong = [0.0, 3.3, 0.0, 1.2, 2.5, 0.0, 0.5, 0.0]
    assert chi_square_p(counts, {i: w / sum(wrong) for i, w in enumerate(wrong)}, DRAWS) < ALPHA


def test_shape_seed_and_batched_rows():
    probs = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 0.0, 2.0]], [[0.0, 5.0, 0.0], [0.0, 1.0, 0.0]]])  # [2, 2, 3]
    assert sample_categorical(probs, torch.Generator().manual_seed(1)).tolist() == [[0, 2], [1, 1]]
    a = sample_categorical(torch.ones(64, 50), torch.Generator().manual_seed(7))
    b = sample_categorical(torch.ones(64, 50), torch.Generator().manual_seed(7))
    c = sample_categorical(torch.ones(64, 50), torch.Generator().manual_seed(8))
    assert a.shape == (64,) and torch.equal(a, b) and not torch.equal(a, c)


def test_uniforms_at_the_ends_land_on_the_first_and_last_positive_weights():
    weights = torch.tensor([WEIGHTS] * 4)
    below_one = torch.tensor(1.0, dtype=torch.float64).nextafter(torch.tensor(0.0, dtype=torch.float64))
    uniform = torch.stack([torch.tensor(0.0, dtype=torch.float64), below_one,
                           torch.tensor(1.0, dtype=torch.float64), torch.tensor(3.5 / 7.5, dtype=torch.float64)])
    # 0 -> index 1 (the zero-weight index 0 is skipped); just below 1 and even 1 itself -> index 6, never the
    # trailing zero-weight index 7; exactly the first boundary -> the next positive index, 3
    assert categorical_from_uniform(weights, uniform).tolist() == [1, 6, 6, 3]


@pytest.mark.parametrize("bad", [[0.0, 0.0, 0.0], [0.2, float("nan"), 0.8]])
def test_a_distribution_without_finite_positive_mass_is_refused(bad):
    with pytest.raises(GenerationError, match=r"cannot sample: a distribution has no positive finite mass"):
        sample_categorical(torch.tensor([[0.5, 0.5, 0.0], bad]), torch.Generator().manual_seed(0))


def test_the_running_sum_is_float64_except_on_a_device_without_it():
    assert running_sum_dtype(torch.device("cpu")) == running_sum_dtype(torch.device("cuda")) == torch.float64
    assert running_sum_dtype(torch.device("mps")) == torch.float32
    assert categorical_from_uniform(torch.tensor([[0.0, 1.0, 1.0]]), torch.tensor([0.75])).tolist() == [2]
