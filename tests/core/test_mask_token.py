"""The mask token of training: <|MASK|> where the embedding has a spare row, else an existing token (SmolLM2)."""

from __future__ import annotations

import pytest
from dflash_core import TargetModel
from dflash_core.errors import CompatibilityError
from dflash_core.target.pairing import MASK_TOKEN, mask_token_for_training
from tiny import tiny_target


def _tokenizer_without_mask():
    """A real byte-level BPE with <|endoftext|> only (no <|MASK|>), trained here on this file."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([open(__file__, encoding="utf-8").read()] * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")


def test_mask_is_added_where_the_embedding_has_a_spare_row():
    tokenizer = _tokenizer_without_mask()
    size = len(tokenizer)
    assert mask_token_for_training(tokenizer, TargetModel(tiny_target(vocab=size + 1))) == size
    assert tokenizer.convert_ids_to_tokens(size) == MASK_TOKEN


def test_no_spare_row_is_refused_naming_mask_token():
    tokenizer = _tokenizer_without_mask()
    hint = r"rows: give an existing reserved token as the mask instead \(dflash train --mask-token\)"
    with pytest.raises(CompatibilityError, match=hint):
        mask_token_for_training(tokenizer, TargetModel(tiny_target(vocab=len(tokenizer))))


def test_an_existing_token_serves_as_the_mask_and_nothing_is_added():
    tokenizer = _tokenizer_without_mask()
    size = len(tokenizer)
    target = TargetModel(tiny_target(vocab=size))
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert mask_token_for_training(tokenizer, target, "<|endoftext|>") == eos
    assert len(tokenizer) == size and MASK_TOKEN not in tokenizer.get_vocab()


def test_unknown_mask_token_is_refused_in_one_line():
    tokenizer = _tokenizer_without_mask()
    with pytest.raises(CompatibilityError, match=r"the mask token '<nope>' is not in the tokenizer's vocabulary"):
        mask_token_for_training(tokenizer, TargetModel(tiny_target(vocab=len(tokenizer))), "<nope>")
