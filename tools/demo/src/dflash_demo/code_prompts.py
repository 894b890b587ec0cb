"""Code-task prompts (OpenAI-style chats) for a code model, made from the Python standard library on this machine.

The Qwen2.5-Coder drafter learns the coder's own answers, so what matters is a spread of the requests a code
assistant gets. They are made from the stdlib's public functions and methods (`chat_prompts`' module walk):
write a function from its signature and the first sentence of its docstring, complete a function from its
header and docstring, and, for short ones, explain, refactor, type, test or review its source. The held-out
split is `chat_prompts`' (a hash of the module name): held-out chats come only from held-out modules, so a
held-out prompt never shares its subject, nor its module, with a training prompt.

    python -m dflash_demo.code_prompts --count N --seed S --out P.jsonl [--heldout]

Each row is {"messages": [{"role": "user", "content": ...}], "subject": "module.function"} (`dflash data`
reads the messages and ignores the subject). A larger --count extends a smaller one's list (`ordered_texts`).
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .chat_prompts import first_sentence, first_texts, is_heldout, ordered_texts, parse_module, stdlib_modules, \
    write_rows_main

# from a description: the signature and the docstring's first sentence, or the header to complete
SPEC_TEMPLATES = (
    "Write a Python function `{signature}` that does the following: {doc}",
    "Implement `{signature}` in Python. Its documentation says: {doc}",
    "Complete this function:\n```python\n{header}\n```",
)
# from the code: a short function's whole source
CODE_TEMPLATES = (
    "Explain what this code does:\n```python\n{source}\n```",
    "Refactor this function to make it easier to read, keeping its behaviour:\n```python\n{source}\n```",
    "Add type hints to this function:\n```python\n{source}\n```",
    "Write a unit test with pytest for this function:\n```python\n{source}\n```",
    "Review this function: what edge cases or bugs do you see?\n```python\n{source}\n```",
)
MAX_SOURCE_LINES = 24  # a snippet short enough that the prompt stays a few hundred tokens
MAX_SOURCE_CHARS = 900
MAX_HEADER_CHARS = 900


@dataclass(frozen=True)
class Function:
    """A public function or method of a stdlib module, as the templates need it."""

    subject: str  # module.function or module.Class.method
    signature: str  # name(args) as written, Class.name(self, ...) for a method
    doc: str  # the docstring's first sentence ("" when it has none of 30-240 characters)
    header: str  # the def line(s) and the whole docstring, dedented ("" without a docstring)
    source: str  # the whole function, dedented ("" when longer than the snippet limits)


def _lines(text: list[str], first: int, last: int) -> str:
    """Source lines first..last (1-based, inclusive), dedented."""
    return textwrap.dedent("".join(text[first - 1:last])).rstrip()


def _function(node: ast.FunctionDef, lines: list[str], subject: str, owner: str) -> Function:
    signature = f"{owner}{node.name}({ast.unparse(node.args)})"
    start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
    source = _lines(lines, start, node.end_lineno)
    if source.count("\n") + 1 > MAX_SOURCE_LINES or len(source) > MAX_SOURCE_CHARS or source.count("\n") < 2:
        source = ""
    header = ""
    docstring = ast.get_docstring(node)
    if docstring is not None:
        header = _lines(lines, start, node.body[0].end_lineno)
        header = header if len(header) <= MAX_HEADER_CHARS else ""
    return Function(subject, signature, first_sentence(docstring), header, source)


def functions(path: Path, module: str) -> list[Function]:
    """The module's public functions and its public classes' public methods, in file order."""
    tree = parse_module(path)
    if tree is None:
        return []
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    found = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            found.append(_function(node, lines, f"{module}.{node.name}", ""))
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and not item.name.startswith("_"):
                    found.append(_function(item, lines, f"{module}.{node.name}.{item.name}", f"{node.name}."))
    return found


def _groups(heldout: bool, subjects: dict[str, str]) -> Iterator[list[str]]:
    """Per function, the texts of its description group and of its code group (`ordered_texts` draws one of
    each first); `subjects` is filled with each text's function."""
    for module, path in stdlib_modules().items():
        if is_heldout(module) != heldout:
            continue
        for function in functions(path, module):
            spec = [t.format(signature=function.signature, doc=function.doc) for t in SPEC_TEMPLATES[:2]
                    if function.doc]
            spec += [SPEC_TEMPLATES[2].format(header=function.header)] if function.header else []
            code = [t.format(source=function.source) for t in CODE_TEMPLATES] if function.source else []
            for group in (spec, code):
                if group:
                    subjects.update((text, function.subject) for text in group)
                    yield group


def _modules_in_turn(texts: list[str], subjects: dict[str, str]) -> list[str]:
    """`texts` taken one module at a time, in turn (each module's in their order; modules by first appearance)."""
    by_module: dict[str, list[str]] = {}
    for text in texts:
        by_module.setdefault(subjects[text].split(".")[0], []).append(text)
    queues = list(by_module.values())
    return [queue[i] for i in range(max(map(len, queues), default=0)) for queue in queues if i < len(queue)]


def code_chats(heldout: bool, count: int, seed: int) -> list[dict]:
    """`count` rows {"messages": [one user turn], "subject": "module.function"} from the held-out or training
    modules: first one description and one code template per function (drawn by `seed`), then the others. Held-out
    chats come from each held-out module in turn, so one large module (tkinter: half of them) does not fill the set,
    and none is a training chat's text (cProfile.Profile.run is profile.Profile.run)."""
    subjects: dict[str, str] = {}
    texts = ordered_texts(_groups(heldout, subjects), seed)
    if heldout:
        training = {text for group in _groups(False, {}) for text in group}
        texts = _modules_in_turn([text for text in texts if text not in training], subjects)
    texts = first_texts(texts, count)
    return [{"messages": [{"role": "user", "content": text}], "subject": subjects[text]} for text in texts]


def main(argv: list[str] | None = None) -> int:
    return write_rows_main(code_chats, __doc__, "code chats", argv)


if __name__ == "__main__":
    raise SystemExit(main())
