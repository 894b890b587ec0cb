"""Incremental detokenization for streaming: print only text that can no longer change."""

from __future__ import annotations

import sys


class TextStream:
    """Feed committed token ids with `push`; text is written once it is stable (no partial UTF-8)."""

    def __init__(self, tokenizer, out=None) -> None:
        self.tokenizer, self.out = tokenizer, out or sys.stdout
        self.tokens: list[int] = []
        self.printed = 0

    def push(self, tokens: list[int], final: bool = False) -> None:
        self.tokens.extend(tokens)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        stable = len(text) if final else len(text.rstrip("\ufffd"))
        if stable > self.printed:
            self.out.write(text[self.printed:stable])
            self.out.flush()
            self.printed = stable
