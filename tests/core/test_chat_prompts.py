"""Chat prompts: OpenAI-style messages through the tokenizer's own chat template, stopping at its end of turn.

A real byte-level BPE (tests/tiny.py) given a ChatML-style template here; the real SmolLM2 tokenizer
is covered by tests/real_model.
"""

from __future__ import annotations

import json

import pytest
from dflash_core.errors import DataError, GenerationError
from dflash_core.target.prompts import chat_ids, encode_prompt, end_of_turn_ids, prompt_ids
from dflash_core.training.data import read_prompts
from tiny import tiny_tokenizer

TEMPLATE = ("{% for m in messages %}{{ '<|endoftext|>' + m['role'] + '\n' + m['content'] + '<|MASK|>' + '\n' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|endoftext|>assistant\n' }}{% endif %}")


@pytest.fixture(scope="module")
def tokenizer():
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def test_chat_is_rendered_by_the_template_with_the_assistant_turn_open(tokenizer):
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "def f(x):"}]
    ids = chat_ids(tokenizer, chat)
    expected = "<|endoftext|>system\nbe brief<|MASK|>\n<|endoftext|>user\ndef f(x):<|MASK|>\n<|endoftext|>assistant\n"
    assert ids == tokenizer(expected, add_special_tokens=False)["input_ids"]
    assert encode_prompt(tokenizer, chat).tolist() == [ids]


def test_plain_text_is_encoded_as_is(tokenizer):
    assert prompt_ids(tokenizer, "import os") == tokenizer("import os", add_special_tokens=False)["input_ids"]


def test_end_of_turn_is_read_from_the_template(tokenizer):
    assert end_of_turn_ids(tokenizer) == [tokenizer.convert_tokens_to_ids("<|MASK|>")]


def test_no_template_is_one_clear_error():
    plain = tiny_tokenizer()
    assert end_of_turn_ids(plain) == []
    with pytest.raises(GenerationError, match="the tokenizer has no chat template"):
        chat_ids(plain, [{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("messages, problem", [
    ([], "non-empty list"),
    ("hi", "non-empty list"),
    (["hi"], "message 0 is not an object"),
    ([{"content": "hi"}], "message 0 has no non-empty 'role'"),
    ([{"role": "user", "content": "a"}, {"role": "user", "content": 3}], "message 1 has no 'content' string"),
])
def test_bad_messages_are_named(tokenizer, messages, problem):
    with pytest.raises(GenerationError, match=problem):
        chat_ids(tokenizer, messages)


def test_prompt_files_hold_text_and_chats(tmp_path):
    path = tmp_path / "prompts.jsonl"
    chat = [{"role": "user", "content": "hello"}]
    path.write_text(json.dumps({"prompt": "import os"}) + "\n" + json.dumps({"messages": chat, "id": 7}) + "\n")
    assert read_prompts(path) == ["import os", chat]
    path.write_text(json.dumps({"prompt": "x"}) + "\n" + json.dumps({"messages": [{"role": "user"}]}) + "\n")
    with pytest.raises(DataError, match=r"prompts.jsonl:2: message 0 has no 'content' string"):
        read_prompts(path)
