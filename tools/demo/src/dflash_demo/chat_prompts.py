"""Instruction prompts (OpenAI-style chats) derived from the Python standard library on this machine.

The SmolLM2 drafter learns SmolLM2's own answers, so what matters is a spread of ordinary chat
requests. They are made from what every machine has: the stdlib's modules, their public functions
and classes and the first sentence of their docstrings, put into instruction templates (explain,
give an example, summarise, compare, write a function, plus general questions about each module's
topic). Modules are split by a hash of their name: held-out chats come only from held-out modules,
so a held-out prompt never shares its subject with a training prompt.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import random
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from dflash_core.files.atomic import atomic_file


NAME_TEMPLATES = (
    "Explain what `{qual}` does in Python, in a few sentences.",
    "Write a short Python example that uses `{qual}` and explain the output.",
    "When would I use `{qual}` in a Python program?",
    "What are common mistakes when using `{qual}`?",
    "Show me how to call `{qual}` and describe its arguments.",
)
DOC_TEMPLATES = (
    "Summarize this in one sentence: {doc}",
    "Rewrite this description in simpler words: {doc}",
    "Explain this to a beginner programmer: {doc}",
    "Turn this description into a short bulleted list: {doc}",
)
MODULE_TEMPLATES = (
    "What is the Python module `{module}` used for?",
    "Give three tips for using the `{module}` module in Python.",
    "Write a small Python script that demonstrates the `{module}` module.",
    "Compare the `{module}` module with a similar tool in another programming language.",
)


@dataclass(frozen=True)
class Subject:
    module: str
    qual: str
    doc: str


def first_sentence(doc: str | None) -> str:
    """The first sentence of a docstring's first paragraph, or "" when it is not 30-240 characters long."""
    text = " ".join((doc or "").strip().split("\n\n")[0].split())
    end = text.find(". ")
    text = text[: end + 1] if end > 0 else text
    return text if 30 <= len(text) <= 240 else ""


def parse_module(path: Path) -> ast.Module | None:
    """The syntax tree of a stdlib file, or None where it cannot be read or parsed here."""
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None


def _subjects(path: Path, module: str) -> list[Subject]:
    tree = parse_module(path)
    found = []
    for node in tree.body if tree else []:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            found.append(Subject(module, f"{module}.{node.name}", first_sentence(ast.get_docstring(node))))
    return found


def stdlib_modules() -> dict[str, Path]:
    """Top-level pure-Python stdlib modules (no tests, no private ones) -> their file."""
    root = Path(sysconfig.get_paths()["stdlib"])
    modules = {}
    for path in sorted(root.glob("*.py")):
        if not path.stem.startswith("_") and "test" not in path.stem:
            modules[path.stem] = path
    for path in sorted(root.glob("*/__init__.py")):
        name = path.parent.name
        if not name.startswith("_") and name not in ("test", "idlelib", "lib2to3", "site-packages", "turtledemo"):
            modules[name] = path
    return modules


def is_heldout(module: str, fraction: float = 0.12) -> bool:
    digest = hashlib.sha256(module.encode()).digest()
    return int.from_bytes(digest[:4], "big") < fraction * 2**32


def ordered_texts(groups: Iterable[Sequence[str]], seed: int) -> list[str]:
    """Every text of `groups`, deduplicated, in an order that a later, larger list only extends.

    From each group one text, drawn by `seed` (a group of one: that text, no draw), goes to the first list, the
    others to the second; each list is sorted, then shuffled: the first by the same generator, the second by its
    own, so the first list is drawn the same way however many groups follow it.
    """
    rng = random.Random(seed)
    first: list[str] = []
    more: list[str] = []
    for group in groups:
        pick = group[0] if len(group) == 1 else rng.choice(group)
        first.append(pick)
        more += [text for text in group if text != pick]
    first = sorted(set(first))
    rng.shuffle(first)
    more = sorted(set(more) - set(first))
    random.Random(f"{seed}:more").shuffle(more)  # its own stream: the first list is drawn as before
    return first + more


def first_texts(texts: list[str], count: int) -> list[str]:
    """The first `count` of `texts`; ValueError (one line) when there are fewer."""
    if len(texts) < count:
        raise ValueError(f"only {len(texts)} distinct prompts from the stdlib here, expected at least {count}.")
    return texts[:count]


def _chat_groups(heldout: bool) -> Iterator[list[str]]:
    for module, path in stdlib_modules().items():
        if is_heldout(module) != heldout:
            continue
        yield from ([t.format(module=module)] for t in MODULE_TEMPLATES)
        for subject in _subjects(path, module):
            yield [t.format(qual=subject.qual) for t in NAME_TEMPLATES]
            if subject.doc:
                yield [t.format(doc=subject.doc) for t in DOC_TEMPLATES]


def chats(heldout: bool, count: int, seed: int) -> list[dict]:
    """`count` JSONL rows {"messages": [{"role": "user", "content": ...}]} from the held-out or training modules.

    First come the chats of one template per subject (each module's four, one name and one docstring
    template per function or class, drawn by `seed`), shuffled: the list every earlier run drew from, about
    2,750 training chats on Python 3.11. Past those come the subjects' other templates, shuffled apart, so
    a larger `count` extends a smaller one's list instead of reshuffling it (the committed drafters' data
    stays a prefix of any longer list).
    """
    texts = first_texts(ordered_texts(_chat_groups(heldout), seed), count)
    return [{"messages": [{"role": "user", "content": text}]} for text in texts]


def write_rows_main(make_rows: Callable[[bool, int, int], list[dict]], description: str, what: str,
                    argv: list[str] | None) -> int:
    """The command line of a prompt maker: --out, --count, --heldout, --seed; `make_rows(heldout, count, seed)`
    gives the JSONL rows, a ValueError one line on stderr (exit 1, nothing written)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="JSONL file to write (atomically)")
    parser.add_argument("--count", type=int, required=True, help=f"how many {what}")
    parser.add_argument("--heldout", action="store_true", help="from the held-out modules (evaluation prompts)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        rows = make_rows(args.heldout, args.count, args.seed)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    with atomic_file(args.out, "w") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    print(f"{args.out}: {len(rows)} {'held-out' if args.heldout else 'training'} {what}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    return write_rows_main(chats, __doc__, "chats", argv)


if __name__ == "__main__":
    raise SystemExit(main())
