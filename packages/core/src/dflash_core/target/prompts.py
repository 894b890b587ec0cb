"""Prompts as token ids: plain text, or a chat (OpenAI-style `messages`) through the tokenizer's template.

A prompt is either a string (encoded as is, no special tokens added) or a list of messages
`[{"role": "user", "content": "..."}, ...]`, rendered by the tokenizer's own chat template with the
assistant's turn opened (`add_generation_prompt=True`). A chat template marks the end of a turn with
a token of its own (`<|im_end|>`, `<|eot_id|>`, ...): `end_of_turn_ids` finds it by rendering the
template, so generation can stop there even where it is not the model's eos.
"""

from __future__ import annotations

from typing import Union

import torch

from dflash_core.errors import GenerationError

Messages = list[dict]
Prompt = Union[str, Messages]
"""A plain-text prompt, or a chat as a list of {"role", "content"} messages."""

_PROBE = "dflash-end-of-turn-probe"


def messages_problem(messages: object) -> str | None:
    """What keeps `messages` from being a chat (a non-empty list of {role, content} strings), or None."""
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty list of {\"role\": ..., \"content\": ...} objects"
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"message {i} is not an object, expected {{\"role\": ..., \"content\": ...}}"
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not role:
            return f"message {i} has no non-empty 'role' string (user, system, assistant)"
        if not isinstance(content, str):
            return f"message {i} has no 'content' string"
    return None


def _check_template(tokenizer) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise GenerationError("the tokenizer has no chat template, so chat messages cannot be encoded: give a plain "
                              "text prompt instead, or a target whose tokenizer has one.")


def chat_ids(tokenizer, messages: Messages) -> list[int]:
    """Token ids of `messages` through the tokenizer's chat template, ending where the assistant's turn begins."""
    problem = messages_problem(messages)
    if problem:
        raise GenerationError(f"bad chat prompt: {problem}.")
    _check_template(tokenizer)
    try:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    except Exception as exc:  # jinja raises its own types (a template's raise_exception included)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise GenerationError(f"the tokenizer's chat template refused the messages: {first}") from None
    return list(ids["input_ids"])


def prompt_ids(tokenizer, prompt: Prompt) -> list[int]:
    """Token ids of a plain-text prompt (no special tokens added) or of a chat (its template applied)."""
    if isinstance(prompt, str):
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    else:
        ids = chat_ids(tokenizer, prompt)
    if not ids:
        raise GenerationError("the prompt encodes to no tokens: expected at least one.")
    return ids


def encode_prompt(tokenizer, prompt: Prompt, device: str | torch.device = "cpu") -> torch.Tensor:
    """[1, T] token ids of a plain-text prompt or of a chat (see `prompt_ids`)."""
    return torch.tensor([prompt_ids(tokenizer, prompt)], dtype=torch.long, device=device)


def end_of_turn_ids(tokenizer) -> list[int]:
    """The special token the chat template puts right after a message's content, if any ([] without a template).

    Found by rendering a one-message assistant turn: the first token after the content is the end of
    turn when it is one of the tokenizer's special (added) tokens.
    """
    if not getattr(tokenizer, "chat_template", None):
        return []
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "assistant",
                                              "content": _PROBE}], tokenize=False)
    except Exception:  # a template that refuses this shape of chat: no end-of-turn token learnt from it
        return []
    if not isinstance(text, str) or _PROBE not in text:
        return []
    after = text.split(_PROBE, 1)[1]
    ids = tokenizer(after, add_special_tokens=False)["input_ids"] if after else []
    special = set(getattr(tokenizer, "all_special_ids", [])) | set(getattr(tokenizer, "added_tokens_decoder", {}))
    return [ids[0]] if ids and ids[0] in special else []
