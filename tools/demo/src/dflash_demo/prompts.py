"""Code prompts cut from the corpus: a window of whole lines, often ending at a `def` header."""

from __future__ import annotations

import random

from .corpus import CorpusSplit


def code_prompts(split: CorpusSplit, files: tuple[str, ...], count: int, seed: int, *, min_chars: int = 200,
                 max_chars: int = 900, def_fraction: float = 0.7) -> list[dict]:
    """`count` prompts, each a run of whole lines of one file; most end with a function header."""
    rng = random.Random(seed)
    prompts: list[dict] = []
    texts: dict[str, list[str]] = {}
    while len(prompts) < count:
        name = rng.choice(files)
        lines = texts.setdefault(name, split.read(name).splitlines(keepends=True))
        ends = [i for i, line in enumerate(lines) if line.lstrip().startswith("def ") and line.rstrip().endswith(":")]
        if not ends or rng.random() > def_fraction:
            ends = list(range(len(lines)))
        if not ends:
            continue
        end = rng.choice(ends)
        start = end
        while start > 0 and sum(len(x) for x in lines[start - 1 : end + 1]) <= max_chars:
            start -= 1
        text = "".join(lines[start : end + 1])
        if len(text) >= min_chars and text.strip():
            prompts.append({"prompt": text, "source": f"{name}:{end + 1}"})
    return prompts
