"""Notices from the journal: every event people must hear of, sent once.

The events that call for a person — an approval requested, an op in doubt, a decision
needed (a partial completion), a NEED_HELP question (or a status probe that found the
loop stuck), a round limit reached, a budget crossing 50, 80 or 100 %, a task stalled,
failed or finished — are read from each task's journal after a cursor
kept in the store's shared state (`notices:<task id>`), so every worker sweeping the
same database sends each of them once. A notice is taken before it is sent and the
cursor moves on after: a sweeper that dies in between leaves the take to expire (or to
be taken over at once, when it was a process of this host that is gone), and the next
one sends it again with the same id (receivers drop the repeat), unless the journal
already has its `notice.sent` (the sender died after recording it): then only the cursor
moves.

A task first seen more than `FIRST_SIGHT_MAX_AGE` after its last change is not
announced: a database that gains this module does not flood anyone with its history.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tether import events as ev
from tether import failpoints, lifecycle
from tether.runtime import hints
from tether.runtime.takeover import owner_is_dead, process_id
from tether.runtime.watch.sinks import Notice, Notifier
from tether.store.base import Store, StoredEvent, TaskRecord

#: The journal events that may make a notice.
TYPES = frozenset({"approval.requested", "decision.requested", "budget.threshold", "task.status"})
#: Events that answer a request for a person (read with `TYPES` to tell a stale one).
ANSWERS = frozenset({"approval.decided", "approval.closed"})
#: Notices that ask a person to act: not sent once the journal shows the request
#: answered, or the task out of that wait (a webhook would page a team for nothing).
ASKS = frozenset(
    {"approval_requested", "op_in_doubt", "decision_needed", "need_help", "limit_reached"}
)
#: Status reasons of a wait at a limit a person must raise: a round limit
#: (`checks.limits`), a context budget no compaction can fit (`compaction`).
LIMIT_REASONS = frozenset({"max_rounds", "max_rounds_per_milestone", "context_budget"})
#: Status reason of a wait after a status probe found the loop stuck (`runtime.probe`).
PROBE_ESCALATED = "status_probe"
#: What ends a wait's words before the command that answers it (`hints.tell`).
ANSWER_WITH = "; answer with: "
#: A take older than this is given to the next sweeper (its sender died).
TAKE_TTL = 120.0
#: Tasks untouched for longer than this when first seen are not announced.
FIRST_SIGHT_MAX_AGE = 24 * 3600.0


def key(task_id: str) -> str:
    """The shared-state key of a task's notice cursor."""
    return f"notices:{task_id}"


def _status_notice(task: TaskRecord, d: dict[str, Any]) -> tuple[str, str] | None:
    dst = str(d.get("dst", ""))
    why = str(d.get("reason") or d.get("stop_reason") or "")
    # What the task tells the person in `status` (the wait's own words: the model's
    # question, the command that raises a limit), kept in the event itself.
    told = str(d.get("told") or "")
    if not told and task.waiting and task.waiting.get("kind") == "human":
        # A status event journaled before waits kept their words (`told`).
        told = str(task.waiting.get("reason", ""))
    if dst == "waiting" and why in ("needs_user_input", PROBE_ESCALATED):
        return "need_help", told or "the agent asks a person for help"
    if dst == "waiting" and why in LIMIT_REASONS:
        # Nothing goes on until someone raises the limit (`tether edit`) and resumes.
        return "limit_reached", told or f"{why} reached; raise the limit and resume"
    if dst == "stalled":
        return "stalled", why
    if dst == "failed":
        return "failed", f"failed: {why}"
    if lifecycle.is_terminal(dst):
        return "finished", f"{dst} ({d.get('stop_reason') or why})"
    return None


def notice_of(
    task: TaskRecord, event: StoredEvent, before: StoredEvent | None = None
) -> Notice | None:
    """The notice one journal event calls for, if any (`before`: the event just before
    it, when it is one of `TYPES`: a wait for a decision is announced by its
    `decision.requested`, not again by its status change)."""
    d = event.data
    if (
        event.type == "task.status"
        and before is not None
        and before.type == "decision.requested"
        and before.seq == event.seq - 1
    ):
        return None
    kind: str
    text: str
    details: dict[str, Any] = {"event": event.type, "seq": event.seq, "at": event.at}
    if event.type == "approval.requested":
        request_id = str(d.get("request_id", ""))
        kind = "op_in_doubt" if ".in_doubt" in request_id else "approval_requested"
        tid = task.task_id
        text = f"{str(d.get('what', ''))[:400]} ({d.get('impact', '')}); decide: " + (
            f"{hints.approve(tid, request_id)} (send again), "
            f"{hints.approve(tid, request_id)} --done (it happened) or "
            f"{hints.reject(tid, request_id)}"
            if kind == "op_in_doubt"
            else f"{hints.approve(tid, request_id)} or {hints.reject(tid, request_id)}"
        )
        details |= {"request_id": request_id, "options": d.get("options")}
        # The request itself: what would be done, its impact, the op it is about.
        details |= {"what": d.get("what"), "impact": d.get("impact"), "op_id": d.get("op_id")}
    elif event.type == "decision.requested":
        kind, text = "decision_needed", str(d.get("reason", ""))
        details["question"] = text
    elif event.type == "budget.threshold":
        kind = "budget"
        text = (
            f"{d.get('percent')} % of the {d.get('scope')} {d.get('resource')} budget used "
            f"({d.get('used')} of {d.get('limit')})"
        )
        details |= {"percent": d.get("percent"), "resource": d.get("resource")}
    elif event.type == "task.status":
        found = _status_notice(task, d)
        if found is None:
            return None
        kind, text = found
        details |= {"status": d.get("dst")}
        if kind in ("need_help", "limit_reached"):
            # The question alone, without the command that answers it.
            details["question"] = text.rpartition(ANSWER_WITH)[0] or text
    else:
        return None
    return Notice(task.task_id, kind, text[:1000], details, notice_id=f"{task.task_id}:{event.seq}")


def _take(seq: int) -> Callable[[dict[str, Any] | None, float], tuple[dict[str, Any], bool]]:
    me = process_id()

    def step(doc: dict[str, Any] | None, now: float) -> tuple[dict[str, Any], bool]:
        state = dict(doc or {"after": 0})
        taking = state.get("taking")
        if int(state.get("after", 0)) >= seq:
            return state, False  # sent already
        if (
            taking
            and taking.get("seq") == seq
            and float(taking.get("until", 0)) > now
            and not owner_is_dead(taking.get("by"))
        ):
            # Another sweeper is sending it. A take whose sender died (a process of
            # this host that is gone) is not waited out: its notice may be lost or
            # half sent, and every later notice of the task waits behind it.
            return state, False
        state["taking"] = {"seq": seq, "until": now + TAKE_TTL, "by": me}
        return state, True

    return step


def _advance(seq: int) -> Callable[[dict[str, Any] | None, float], tuple[dict[str, Any], None]]:
    def step(doc: dict[str, Any] | None, now: float) -> tuple[dict[str, Any], None]:
        state = dict(doc or {})
        state["after"] = max(int(state.get("after", 0)), seq)
        taking = state.get("taking")
        if taking and int(taking.get("seq", 0)) <= state["after"]:
            state.pop("taking")
        return state, None

    return step


async def _journaled(store: Store, task_id: str, seq: int, notice_id: str) -> bool:
    """Whether the notice of event `seq` was journaled as sent (after that event)."""
    sent = await store.read_events(task_id, after=seq, types={"notice.sent"})
    return any(e.data.get("notice_id") == notice_id for e in sent)


def _answered(asked: StoredEvent, later: Sequence[StoredEvent]) -> bool:
    """Whether the journal after a request for a person already answers it: its
    approval decided or closed, or (a decision, a question, a limit) the task out of
    the wait it started."""
    if asked.type == "approval.requested":
        rid = asked.data.get("request_id")
        return any(e.type in ANSWERS and e.data.get("request_id") == rid for e in later)
    return any(e.type == "task.status" and e.data.get("src") == "waiting" for e in later)


async def announce(store: Store, task: TaskRecord, notifier: Notifier, now: float) -> list[Notice]:
    """Send the notices of `task`'s journal since its cursor; returns those sent here."""
    doc = await store.get_shared(key(task.task_id))
    if doc is None and now - task.updated_at > FIRST_SIGHT_MAX_AGE:
        await store.update_shared(key(task.task_id), _advance(task.last_seq))
        return []
    after = int((doc or {}).get("after", 0))
    if after >= task.last_seq:
        return []
    sent: list[Notice] = []
    before: StoredEvent | None = None
    events = await store.read_events(task.task_id, after=after, types=TYPES | ANSWERS)
    for k, event in enumerate(events):
        notice = notice_of(task, event, before)
        before = event
        if notice is None or (notice.kind in ASKS and _answered(event, events[k + 1 :])):
            continue
        if not await store.update_shared(key(task.task_id), _take(event.seq)):
            return sent  # another sweeper is on this task: it goes on from here
        if await _journaled(store, task.task_id, event.seq, notice.notice_id):
            # Its sender died after journaling it, before moving the cursor: it went out.
            await store.update_shared(key(task.task_id), _advance(event.seq))
            continue
        failpoints.hit("before_notice_send")
        channel = await notifier.notify(notice)
        failpoints.hit("after_notice_send")
        await store.commit(
            task.task_id,
            None,
            [
                ev.NoticeSent(
                    kind=notice.kind,
                    channel=channel,
                    text=notice.text[:500],
                    notice_id=notice.notice_id,
                )
            ],
        )
        failpoints.hit("after_notice_commit")
        await store.update_shared(key(task.task_id), _advance(event.seq))
        sent.append(notice)
    await store.update_shared(key(task.task_id), _advance(task.last_seq))
    return sent
