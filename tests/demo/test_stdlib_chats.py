"""The SmolLM2 chats from the standard library: a longer list extends a shorter one, the held-out split holds,
and asking for more chats than the stdlib gives is a one-line error that writes nothing."""

from __future__ import annotations

import json
import re

import pytest

from dflash_demo.chat_prompts import chats, main


@pytest.fixture(scope="module")
def every_training_chat() -> list[str]:
    with pytest.raises(ValueError, match=r"only \d+ distinct prompts") as too_many:
        chats(False, 10**9, seed=2)
    total = int(re.search(r"only (\d+)", str(too_many.value)).group(1))
    return [row["messages"][0]["content"] for row in chats(False, total, seed=2)]


def test_a_longer_list_extends_a_shorter_one(every_training_chat):
    # Past the one-template-per-subject chats (about 2,750 on Python 3.11) come the other templates; the
    # GPU recipe asks for 4,000, more than the first list holds.
    assert len(every_training_chat) > 4000
    assert len(set(every_training_chat)) == len(every_training_chat)
    for count in (64, 2000, 4000):
        assert [row["messages"][0]["content"] for row in chats(False, count, seed=2)] == every_training_chat[:count]


def test_held_out_chats_share_no_text_with_training_chats(every_training_chat):
    heldout = [row["messages"][0]["content"] for row in chats(True, 48, seed=1)]
    assert len(heldout) == 48
    assert not set(heldout) & set(every_training_chat)


def test_asking_for_more_than_the_stdlib_gives_is_one_line_and_writes_nothing(tmp_path, capsys, every_training_chat):
    out = tmp_path / "chats.jsonl"
    assert main(["--count", str(len(every_training_chat) + 1), "--seed", "2", "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"only {len(every_training_chat)} distinct prompts" in err
    assert not out.exists()
    assert main(["--count", "5", "--seed", "2", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["messages"][0]["content"] for row in rows] == every_training_chat[:5]
