"""The code chats from the standard library: held-out chats share no module with training chats, the same seed
gives the same list, a longer list extends a shorter one, every template is used, and the committed held-out set
is what the command makes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dflash_demo.chat_prompts import is_heldout
from dflash_demo.code_prompts import CODE_TEMPLATES, SPEC_TEMPLATES, code_chats, main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def every_training_chat() -> list[dict]:
    with pytest.raises(ValueError, match=r"only \d+ distinct prompts") as too_many:
        code_chats(False, 10**9, seed=2)
    return code_chats(False, int(re.search(r"only (\d+)", str(too_many.value)).group(1)), seed=2)


def _module(subject: str) -> str:
    return subject.split(".")[0]


def _text(row: dict) -> str:
    return row["messages"][0]["content"]


def test_held_out_chats_share_no_module_and_no_text_with_training_chats(every_training_chat):
    heldout = code_chats(True, 200, seed=1)
    held_modules = {_module(row["subject"]) for row in heldout}
    train_modules = {_module(row["subject"]) for row in every_training_chat}
    assert held_modules and not held_modules & train_modules
    assert all(is_heldout(m) for m in held_modules) and not any(is_heldout(m) for m in train_modules)
    assert not {_text(row) for row in heldout} & {_text(row) for row in every_training_chat}


def test_the_same_seed_gives_the_same_list_and_a_longer_list_extends_a_shorter_one(every_training_chat):
    assert len(every_training_chat) > 6000  # the CPU recipe asks for a few thousand at most
    assert len({_text(row) for row in every_training_chat}) == len(every_training_chat)
    for count in (64, 3000):
        assert code_chats(False, count, seed=2) == every_training_chat[:count]
    assert code_chats(False, 64, seed=3) != every_training_chat[:64]


def test_every_template_is_used_and_each_chat_is_one_user_turn(every_training_chat):
    first = every_training_chat[:2000]  # the templates are mixed from the start, not only past the first list
    for template in SPEC_TEMPLATES + CODE_TEMPLATES:
        opening = template.split("{")[0]
        assert any(_text(row).startswith(opening) for row in first), opening
    for row in every_training_chat:
        assert set(row) == {"messages", "subject"} and len(row["messages"]) == 1
        assert row["messages"][0]["role"] == "user" and row["messages"][0]["content"].strip()


def test_the_committed_held_out_set_is_what_the_command_makes(tmp_path):
    out = tmp_path / "heldout.jsonl"
    assert main(["--heldout", "--count", "48", "--seed", "1", "--out", str(out)]) == 0
    assert out.read_bytes() == (ROOT / "models/qwen-coder/heldout.jsonl").read_bytes()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 48 and all(is_heldout(_module(row["subject"])) for row in rows)


def test_asking_for_more_than_the_stdlib_gives_is_one_line_and_writes_nothing(tmp_path, capsys, every_training_chat):
    out = tmp_path / "chats.jsonl"
    assert main(["--count", str(len(every_training_chat) + 1), "--seed", "2", "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"only {len(every_training_chat)} distinct prompts" in err
    assert not out.exists()
