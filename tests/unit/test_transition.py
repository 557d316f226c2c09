"""`lifecycle.transition`, the one builder of a status change: it refuses exactly what the
state machine forbids, and what it builds is the journaled event plus the task-row
fields a store accepts."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether import errors
from tether import events as ev
from tether.lifecycle import (
    ACTIVE,
    KEEP,
    MAX_TOLD_CHARS,
    STATUSES,
    STOP_REASONS,
    TERMINAL,
    TERMINAL_REASONS,
    TRANSITIONS,
    transition,
)
from tether.store._rules import allowed_sources, task_changes
from tether.store.base import UNSET, TaskPatch


@dataclass(frozen=True)
class Task:
    task_id: str
    status: str


ALLOWED = sorted((src, dst) for src, dsts in TRANSITIONS.items() for dst in dsts)
SAME_STATE = [(s, s) for s in sorted(ACTIVE)]
FORBIDDEN = sorted(
    (src, dst)
    for src, dst in itertools.product(STATUSES, STATUSES)
    if dst not in TRANSITIONS[src] and not (src == dst and src in ACTIVE)
)
PATCH_FIELDS = {f.name for f in dataclasses.fields(TaskPatch)}


def fitting_reason(dst: str) -> str | None:
    return sorted(TERMINAL_REASONS[dst])[0] if dst in TERMINAL else None


@pytest.mark.parametrize(("src", "dst"), ALLOWED + SAME_STATE)
def test_an_allowed_change_builds_its_event_and_patch(src: str, dst: str) -> None:
    reason = fitting_reason(dst)
    change, patch = transition(Task("t1", src), dst, "because", stop_reason=reason)
    assert change == ev.TaskStatusChanged(src=src, dst=dst, stop_reason=reason, reason="because")
    # The wait ends with the state: cleared unless said otherwise.
    assert patch == {"status": dst, "stop_reason": reason, "waiting": None, "wake_at": None}
    assert set(patch) <= PATCH_FIELDS
    # What the store writes for it: the status, its stop reason, the wait cleared.
    changes = task_changes(TaskPatch(**patch), None, 1.0)
    assert {k: changes[k] for k in ("status", "stop_reason", "waiting", "wake_at")} == {
        "status": dst,
        "stop_reason": reason,
        "waiting": None,
        "wake_at": None,
    }


@pytest.mark.parametrize(("src", "dst"), FORBIDDEN)
def test_a_forbidden_change_is_refused_whatever_the_reason(src: str, dst: str) -> None:
    for reason in [None, *STOP_REASONS]:
        with pytest.raises(errors.IllegalTransition) as info:
            transition(Task("t1", src), dst, "because", stop_reason=reason)
        assert (info.value.task_id, info.value.src, info.value.dst) == ("t1", src, dst)


@pytest.mark.parametrize("dst", sorted(TERMINAL))
def test_a_terminal_change_needs_a_fitting_stop_reason(dst: str) -> None:
    src = next(s for s in sorted(ACTIVE) if dst in TRANSITIONS[s])
    with pytest.raises(errors.IllegalTransition, match="needs a stop_reason"):
        transition(Task("t1", src), dst)
    for reason in sorted(set(STOP_REASONS) - TERMINAL_REASONS[dst]):
        with pytest.raises(errors.IllegalTransition, match="does not fit"):
            transition(Task("t1", src), dst, stop_reason=reason)


@pytest.mark.parametrize(("src", "dst"), [p for p in ALLOWED if p[1] not in TERMINAL])
def test_a_non_terminal_change_refuses_a_stop_reason(src: str, dst: str) -> None:
    with pytest.raises(errors.IllegalTransition, match="only terminal states stop"):
        transition(Task("t1", src), dst, stop_reason="delivered")


def test_keep_leaves_the_wait_as_it_is() -> None:
    _, patch = transition(Task("t1", "running"), "stalled", "silent", waiting=KEEP, wake_at=KEEP)
    assert patch == {"status": "stalled", "stop_reason": None}
    assert TaskPatch(**patch).waiting is UNSET and TaskPatch(**patch).wake_at is UNSET
    _, patch = transition(Task("t1", "running"), "waiting", "retry", wake_at=KEEP)
    assert patch == {"status": "waiting", "stop_reason": None, "waiting": None}


def test_a_wait_document_goes_with_the_change_and_its_words_into_the_event() -> None:
    doc = {"kind": "human", "reason": "which file?" + "x" * 2 * MAX_TOLD_CHARS}
    change, patch = transition(Task("t1", "running"), "waiting", "need_help", waiting=doc)
    assert patch["waiting"] == doc and patch["waiting"] is not doc
    assert change.told == doc["reason"][:MAX_TOLD_CHARS]
    assert change.data()["told"].startswith("which file?")
    # Only a wait is told; a suspension keeps its document without words in the event.
    change, patch = transition(Task("t1", "waiting"), "suspended", "no answer", waiting=doc)
    assert change.told == "" and "told" not in change.data()
    assert patch["waiting"] == doc
    # A wait without a reason tells nothing.
    change, _ = transition(Task("t1", "running"), "waiting", "retry", waiting={"kind": "retry"})
    assert change.told == ""


@given(
    src=st.sampled_from(STATUSES),
    dst=st.sampled_from(STATUSES),
    reason=st.sampled_from([None, *STOP_REASONS]),
    why=st.text(max_size=40),
)
def test_it_builds_exactly_what_the_store_accepts(
    src: str, dst: str, reason: str | None, why: str
) -> None:
    """The builder and the store's commit condition agree on every (src, dst, reason), and
    the event it builds reads back as the same event from its journaled form."""
    try:
        change, patch = transition(Task("t9", src), dst, why, stop_reason=reason)
    except errors.IllegalTransition as exc:
        assert (exc.src, exc.dst, exc.task_id) == (src, dst, "t9")
        assert src not in allowed_sources(dst, reason)
        return
    assert src in allowed_sources(dst, reason)
    assert (patch["status"], patch["stop_reason"]) == (dst, reason)
    assert ev.EVENT_TYPES[ev.TaskStatusChanged.TYPE].model_validate(change.data()) == change
