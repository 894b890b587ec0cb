"""Lossless on a real pretrained target: DFlash greedy output == Hugging Face generate() of SmolLM2-135M-Instruct.

16 held-out chat prompts one by one, and a ragged batch of 4, in fp32, through the tokenizer's chat
template; generation stops at the template's end of turn. The reference is the target's own
`generate()` WITH the attention mask: SmolLM2's template puts <|im_end|> (its eos and pad) inside the
prompt, and without the mask generate() would hide those prompt positions.
"""

from __future__ import annotations

import pytest
import torch

from smollm2 import heldout_chats, real_drafter, require_target

NEW_TOKENS = 32


@pytest.fixture(scope="module")
def pair():
    from dflash_core.loading import load_target, load_tokenizer

    path = require_target()
    tokenizer = load_tokenizer(path)
    target = load_target(path, (), "fp32")
    drafter = real_drafter(target, tokenizer)
    target.set_layer_ids(drafter.config.target_layer_ids)
    return target, drafter, tokenizer


def hf_greedy(model, prompt: list[int], stops: list[int]) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False,
                         eos_token_id=stops, pad_token_id=stops[0])
    tokens = out[0, len(prompt):].tolist()
    end = next((i + 1 for i, t in enumerate(tokens) if t in stops), len(tokens))
    return tokens[:end]


def test_stops_at_the_templates_end_of_turn(pair):
    from dflash_core.loading import stop_token_ids

    target, _, tokenizer = pair
    assert stop_token_ids(target, tokenizer) == [tokenizer.convert_tokens_to_ids("<|im_end|>")]


def test_sixteen_chats_match_hf_generate(pair):
    from dflash_core import generate
    from dflash_core.loading import encode_prompt, stop_token_ids

    target, drafter, tokenizer = pair
    stops = stop_token_ids(target, tokenizer)
    compared = 0
    for i, chat in enumerate(heldout_chats(16)):
        ids = encode_prompt(tokenizer, chat)
        # the whole block verified every step, a fixed short draft, the cost-aware policy: all lossless
        k = [drafter.config.block_size - 1, 3, "auto", "auto"][i % 4]
        result = generate(target, drafter, ids, max_new_tokens=NEW_TOKENS, stop_token_ids=stops, draft_length=k)
        expected = hf_greedy(target.model, ids[0].tolist(), stops)
        assert result.tokens[0] == expected, f"chat {i}: {chat[0]['content'][:60]!r}"
        compared += len(expected)
    assert compared > 8 * NEW_TOKENS  # not vacuous: most answers run past a few tokens


def test_ragged_batch_of_four_matches_hf_generate(pair):
    from dflash_core import generate
    from dflash_core.loading import encode_prompt, stop_token_ids

    target, drafter, tokenizer = pair
    stops = stop_token_ids(target, tokenizer)
    prompts = [encode_prompt(tokenizer, chat)[0].tolist() for chat in heldout_chats(20)[16:20]]
    assert len({len(p) for p in prompts}) > 1, "the batch must be ragged"
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[stops[0]] * (width - len(p)) + p for p in prompts])  # left-padded
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    result = generate(target, drafter, ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, stop_token_ids=stops,
                      draft_length=7)
    for row, prompt in enumerate(prompts):
        assert result.tokens[row] == hf_greedy(target.model, prompt, stops), f"row {row}"


def test_generate_cli_chat_answers_and_stops_at_the_end_of_turn(pair, tmp_path, capsys):
    import json

    from dflash_cli import main
    from dflash_core.loading import encode_prompt, stop_token_ids

    target, drafter, tokenizer = pair
    drafter.save_pretrained(tmp_path / "drafter", dtype="fp32")
    question = "What is the capital of France?"
    assert main(["generate", "--target", str(require_target()), "--drafter", str(tmp_path / "drafter"), "--chat",
                 question, "--dtype", "fp32", "--max-new-tokens", "24", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    stops = stop_token_ids(target, tokenizer)
    expected = hf_greedy(target.model, encode_prompt(tokenizer, [{"role": "user", "content": question}])[0].tolist(),
                         stops)
    assert report["tokens"] == expected and report["finish_reason"] == "stop"
    assert "Paris" in report["text"] and "<|im_end|>" not in report["text"]
