"""`TETHER_FAILPOINTS`: a misspelt point, action or count is named on stderr and left
out, never taken silently (a fault test whose point never fires would pass)."""

from __future__ import annotations

import pytest

from tether import failpoints


def test_known_points_with_counts_and_actions_are_read() -> None:
    got = failpoints._parse("during_commit=3:stop, after_op_dispatch, during_claim=2")
    assert got == {
        "during_commit": (3, "stop"),
        "after_op_dispatch": (1, "exit"),
        "during_claim": (2, "exit"),
    }


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("during_comit=2", "unknown point 'during_comit'"),
        ("during_commit=2:pause", "unknown action 'pause' for during_commit"),
        ("during_commit=two", "must be a whole number from 1, not 'two'"),
        ("during_commit=0", "must be a whole number from 1, not '0'"),
        ("during_commit=-1:stop", "must be a whole number from 1, not '-1'"),
    ],
)
def test_a_bad_part_is_named_and_left_out(
    text: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    got = failpoints._parse(f"{text},during_claim")
    assert got == {"during_claim": (1, "exit")}
    err = capsys.readouterr().err
    assert "TETHER_FAILPOINTS" in err and said in err and "(ignored)" in err


def test_a_bad_setting_does_not_stop_the_process(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TETHER_FAILPOINTS", "nonsense=x:y")
    failpoints.reset()
    try:
        failpoints.hit("during_commit")  # would raise ValueError before
    finally:
        monkeypatch.delenv("TETHER_FAILPOINTS")
        failpoints.reset()
    assert "unknown point 'nonsense'" in capsys.readouterr().err
