"""Which answers ask a person for help (`phases.asks_for_help`): a line that starts
`NEED_HELP:` (a dash or the line's end for the colon, markdown around it), outside the
model's reasoning block; not a line that muses on asking, nor the words in a sentence."""

from __future__ import annotations

import pytest

from tether.runtime.round.phases import asks_for_help


@pytest.mark.parametrize(
    ("text", "asked"),
    [
        ("NEED_HELP: which folder?", "NEED_HELP: which folder?"),
        ("I read the brief.\nNEED_HELP: miles or km?", "NEED_HELP: miles or km?"),
        ("**NEED_HELP**: the token expired", "**NEED_HELP**: the token expired"),
        ("> NEED_HELP - no access to the repo", "> NEED_HELP - no access to the repo"),
        ("NEED_HELP\nWhich format?", "NEED_HELP\nWhich format?"),
        ("NEED_HELP：哪个目录？", "NEED_HELP：哪个目录？"),
        ("<think>easy</think>\nNEED_HELP: real one", "NEED_HELP: real one"),
        ("NEED_HELP: nothing to do", "NEED_HELP: nothing to do"),
        ("NEED_HELP? No: the brief gives the format, so I go on.", None),
        ("<think>\nNEED_HELP: maybe?\nNo, the brief is clear.\n</think>\nWriting it.", None),
        ("<thinking>NEED_HELP: cut off inside the reasoning", None),
        ("<REASONING>\nNEED_HELP:\n</REASONING>", None),
        ("I won't need NEED_HELP: the brief is clear.", None),
        ("NEED_HELPFUL: not a request", None),
        ("All done.", None),
    ],
)
def test_asks_for_help(text: str, asked: str | None) -> None:
    assert asks_for_help(text) == asked


def test_the_question_is_cut_at_500_characters() -> None:
    asked = asks_for_help("NEED_HELP: " + "why " * 300)
    assert asked is not None and len(asked) <= 500 and asked.startswith("NEED_HELP: why")
