"""The task state machine: exactly the listed transitions are allowed."""

from __future__ import annotations

import itertools

import pytest

from tether import errors
from tether.lifecycle import (
    ACTIVE,
    STATUSES,
    STOP_REASONS,
    TERMINAL,
    TERMINAL_REASONS,
    TRANSITIONS,
    check_transition,
    is_terminal,
)

ALLOWED = sorted((src, dst) for src, dsts in TRANSITIONS.items() for dst in dsts)
SAME_STATE = [(s, s) for s in sorted(ACTIVE)]
FORBIDDEN = sorted(
    (src, dst)
    for src, dst in itertools.product(STATUSES, STATUSES)
    if dst not in TRANSITIONS[src] and not (src == dst and src in ACTIVE)
)


def fitting_reason(dst: str) -> str | None:
    """A stop reason that fits `dst` (None for non-terminal states)."""
    return sorted(TERMINAL_REASONS[dst])[0] if dst in TERMINAL else None


def test_tables_are_consistent() -> None:
    assert set(TRANSITIONS) == set(STATUSES)
    assert set(TERMINAL_REASONS) == TERMINAL
    assert set(STATUSES) == ACTIVE | TERMINAL and not ACTIVE & TERMINAL
    for dsts in TRANSITIONS.values():
        assert dsts <= set(STATUSES)
    for reasons in TERMINAL_REASONS.values():
        assert reasons and reasons <= set(STOP_REASONS)
    # Every stop reason is usable by some terminal state.
    assert set().union(*TERMINAL_REASONS.values()) == set(STOP_REASONS)


def test_design_states() -> None:
    assert {"satisfied", "abandoned", "cancelled", "failed"} == TERMINAL
    assert {"queued", "running", "waiting", "suspended", "stalled", "paused"} == ACTIVE
    for s in STATUSES:
        assert is_terminal(s) == (s in TERMINAL)


@pytest.mark.parametrize(("src", "dst"), ALLOWED)
def test_allowed_transition_passes(src: str, dst: str) -> None:
    check_transition(src, dst, fitting_reason(dst), task_id="t1")


@pytest.mark.parametrize(("src", "dst"), SAME_STATE)
def test_staying_in_an_active_state_passes(src: str, dst: str) -> None:
    check_transition(src, dst)
    with pytest.raises(errors.IllegalTransition, match="only terminal states stop"):
        check_transition(src, dst, "delivered")


@pytest.mark.parametrize(("src", "dst"), FORBIDDEN)
def test_forbidden_transition_raises(src: str, dst: str) -> None:
    # Whatever reason is given, a pair not in the table is refused.
    for reason in [None, *STOP_REASONS]:
        with pytest.raises(errors.IllegalTransition) as info:
            check_transition(src, dst, reason, task_id="t1")
        assert info.value.src == src and info.value.dst == dst
        assert info.value.task_id == "t1"
        assert f"task t1: illegal task transition {src} -> {dst}" in str(info.value)


def test_forbidden_list_is_complete() -> None:
    n = len(STATUSES)
    assert len(ALLOWED) + len(SAME_STATE) + len(FORBIDDEN) == n * n
    assert ("cancelled", "queued") in FORBIDDEN
    assert ("satisfied", "satisfied") in FORBIDDEN
    assert ("queued", "satisfied") in FORBIDDEN


@pytest.mark.parametrize("dst", sorted(TERMINAL))
def test_terminal_needs_a_matching_stop_reason(dst: str) -> None:
    sources = [s for s in STATUSES if dst in TRANSITIONS[s]]
    assert sources, f"{dst} is unreachable"
    for src in sources:
        with pytest.raises(errors.IllegalTransition, match="needs a stop_reason"):
            check_transition(src, dst)
        for reason in STOP_REASONS:
            if reason in TERMINAL_REASONS[dst]:
                check_transition(src, dst, reason)
            else:
                with pytest.raises(errors.IllegalTransition, match="does not fit"):
                    check_transition(src, dst, reason)
        with pytest.raises(errors.IllegalTransition, match="does not fit"):
            check_transition(src, dst, "because")


@pytest.mark.parametrize(("src", "dst"), [p for p in ALLOWED if p[1] not in TERMINAL])
def test_non_terminal_refuses_a_stop_reason(src: str, dst: str) -> None:
    with pytest.raises(errors.IllegalTransition, match="only terminal states stop"):
        check_transition(src, dst, "delivered")


def test_unknown_states() -> None:
    with pytest.raises(errors.IllegalTransition, match="unknown source state"):
        check_transition("sleeping", "running")
    with pytest.raises(errors.IllegalTransition, match="unknown target state"):
        check_transition("running", "sleeping")


def test_cancelled_is_final_and_others_reopen_only_to_queued() -> None:
    assert TRANSITIONS["cancelled"] == frozenset()
    for s in TERMINAL - {"cancelled"}:
        # A delivered task whose pinned source drifted waits for a person (`verify`).
        assert TRANSITIONS[s] == ({"queued", "waiting"} if s == "satisfied" else {"queued"})
        check_transition(s, "queued")
    check_transition("satisfied", "waiting")


def test_illegal_transition_is_a_runtime_failure_not_a_user_error() -> None:
    with pytest.raises(errors.TetherError) as info:
        check_transition("queued", "satisfied", "delivered")
    assert not isinstance(info.value, errors.UserError)
    assert info.value.fields == {"task_id": None, "src": "queued", "dst": "satisfied"}
    assert str(info.value) == "illegal task transition queued -> satisfied"
