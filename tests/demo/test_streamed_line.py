"""`make demo`'s last line: where the streamed outputs part from the target alone's, it says where and what that means."""

from __future__ import annotations

from dflash_demo.session import StreamedPrompt


def _prompt(dflash_parts_at, lookup_parts_at) -> StreamedPrompt:
    return StreamedPrompt(tokens=256, tau=2.5, drafter_steps=60, lookup_steps=3, steps=100, dflash_tok_s=200.0, target_tok_s=100.0,
                          lookup_tok_s=400.0, dflash_parts_at=dflash_parts_at, lookup_parts_at=lookup_parts_at)


def test_identical_outputs_say_yes_and_nothing_more():
    line = _prompt(None, None).line(greedy=True)
    assert line.endswith("| identical to target alone: yes")
    assert "2.00x the target alone and 0.50x prompt lookup (prompt lookup 4.00x)" in line


def test_a_difference_is_located_and_the_comparison_qualified():
    streamed = _prompt(108, None)
    assert not streamed.identical and streamed.lookup_identical
    line = streamed.line(greedy=True)
    assert "identical to target alone: DFlash NO (from new token 108), prompt lookup yes" in line
    assert line.endswith("the speeds compare different texts)")
    assert "identical" not in _prompt(108, 3).line(greedy=False)  # sampling: nothing to compare token for token


def test_the_line_counts_steps_by_source():
    line = _prompt(None, None).line(greedy=True)
    assert "(tau 2.50; 100 steps: 60 drafter, 3 context lookup, 37 plain)" in line


def test_a_completion_ends_where_it_leaves_the_prompts_block():
    from dflash_demo.session import block_end

    prompt = "class A:\n    def f(self):\n"
    body = "        x = 1\n\n        return x\n\n"
    assert block_end(prompt, body) is None  # still inside f
    assert block_end(prompt, body + "    def g(self):\n") == len(body)  # the next method: cut before it
    assert block_end(prompt, body + "    def g") is None  # an unfinished line may still grow
    assert block_end(prompt, "\n    def g(self):\n") is None  # no line of body yet: nothing to end
    new = "class B:\n    x = 1\n"  # a completion that starts a new definition ends with it
    assert block_end(prompt, new + "class C:\n") == len(new) and block_end(prompt, new + "    y = 2\n") is None
    assert block_end("x = [\n", "    1,\n]\n") is None  # no def or class: --max-new-tokens decides
