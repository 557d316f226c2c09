"""Requests close with the task they decide about, on every store (memory, SQLite,
PostgreSQL): a commit that ends a task closes its open requests in its own transaction,
journaled as `approval.closed`; a decided or closed request is final, checked against
the stored request inside the commit's transaction, so a late decision never turns a
closed request into an approved one.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest

from tether import errors
from tether import events as ev
from tether.clock import FakeClock
from tether.rebuild import rebuild
from tether.store import ApprovalRecord, OpRecord, Store, TaskPatch

if TYPE_CHECKING:
    from conftest import Backend, MakeTask


def request(task_id: str, request_id: str, **kw: Any) -> ApprovalRecord:
    base: dict[str, Any] = {
        "request_id": request_id,
        "task_id": task_id,
        "status": "pending",
        "request": {"kind": "op", "what": f"write {request_id}"},
        "op_id": f"op-{request_id}",
    }
    base.update(kw)
    return ApprovalRecord(**base)


def op(task_id: str, op_id: str, status: str) -> OpRecord:
    return OpRecord(
        op_id=op_id,
        task_id=task_id,
        round=1,
        call_index=0,
        tool="write_file",
        args={"path": "out/a.txt"},
        args_hash=f"h-{op_id}",
        effect="write",
        status=status,
    )


def abandon(src: str = "waiting") -> tuple[list[ev.Event], TaskPatch]:
    change = ev.TaskStatusChanged(
        src=src, dst="abandoned", stop_reason="abandoned_by_user", reason="abandoned by ana: gone"
    )
    patch = TaskPatch(status="abandoned", stop_reason="abandoned_by_user", waiting=None)
    return [change], patch


def decided(appr: ApprovalRecord, status: str, by: str = "bo") -> ApprovalRecord:
    return ApprovalRecord(
        request_id=appr.request_id,
        task_id=appr.task_id,
        status=status,
        request=appr.request,
        op_id=appr.op_id,
        decision={"decision": "approve" if status == "approved" else "reject"},
        decided_by=by,
    )


async def _to_waiting(store: Store, task_id: str) -> None:
    await store.commit(
        task_id,
        None,
        [ev.TaskStatusChanged(src="queued", dst="running")],
        task=TaskPatch(status="running"),
    )


async def _waiting_with_requests(store: Store, make_task: MakeTask) -> None:
    await make_task("t")
    await _to_waiting(store, "t")
    await store.commit(
        "t",
        None,
        [
            *(ev.ApprovalRequested(request_id=r, what=f"write {r}") for r in "abc"),
            ev.TaskStatusChanged(src="running", dst="waiting", reason="approval required"),
        ],
        task=TaskPatch(status="waiting", waiting={"kind": "approval"}),
        ops=[op("t", "op-a", "awaiting_approval"), op("t", "op-b", "awaiting_approval")],
        approvals=[request("t", "a"), request("t", "b"), request("t", "c", op_id=None)],
    )


async def test_ending_a_task_closes_its_pending_requests_in_the_same_commit(
    store: Store, make_task: MakeTask
) -> None:
    await _waiting_with_requests(store, make_task)
    # One request was rejected before: it stays as it was.
    (b,) = [a for a in await store.get_approvals("t") if a.request_id == "b"]
    await store.commit(
        "t",
        None,
        [ev.ApprovalDecided(request_id="b", decision="reject", by="bo")],
        approvals=[decided(b, "rejected")],
    )
    before = (await store.get_task("t")).last_seq
    events, patch = abandon()
    res = await store.commit("t", None, events, task=patch)
    assert (res.first_seq, res.last_seq) == (before + 1, before + 3)
    got = {a.request_id: a for a in await store.get_approvals("t")}
    assert {k: a.status for k, a in got.items()} == {"a": "closed", "b": "rejected", "c": "closed"}
    why = "task abandoned: abandoned by ana: gone"
    assert got["a"].decision == {"decision": "closed", "reason": why}
    assert got["a"].decided_by == "tether"
    tail = await store.read_events("t", after=before)
    assert [e.type for e in tail] == ["task.status", "approval.closed", "approval.closed"]
    assert [e.data for e in tail[1:]] == [
        {"request_id": "a", "reason": why, "by": "tether", "op_id": "op-a", "previous": "pending"},
        {"request_id": "c", "reason": why, "by": "tether", "op_id": None, "previous": "pending"},
    ]
    assert (await store.get_task("t")).last_seq == before + 3
    # The log folds to the same requests and task as the projections hold.
    found = await rebuild(store, "t")
    assert (found["consistent"], found["approvals"], found["task"]) == (True, [], [])


async def test_an_approved_request_whose_call_was_never_sent_closes_too(
    store: Store, make_task: MakeTask
) -> None:
    await _waiting_with_requests(store, make_task)
    by_id = {a.request_id: a for a in await store.get_approvals("t")}
    # a: approved, its op still waiting to be sent; b: approved and its op was sent.
    await store.commit(
        "t",
        None,
        [],
        ops=[op("t", "op-b", "succeeded")],
        approvals=[decided(by_id["a"], "approved"), decided(by_id["b"], "approved")],
    )
    events, patch = abandon()
    await store.commit("t", None, events, task=patch)
    got = {a.request_id: a for a in await store.get_approvals("t")}
    assert (got["a"].status, got["b"].status, got["c"].status) == ("closed", "approved", "closed")
    assert got["a"].decision is not None
    assert got["a"].decision["previous"]["status"] == "approved"
    assert got["a"].decision["previous"]["decided_by"] == "bo"
    closed = [e.data for e in await store.read_events("t", types={"approval.closed"})]
    assert [(d["request_id"], d["previous"]) for d in closed] == [
        ("a", "approved"),
        ("c", "pending"),
    ]


@pytest.mark.parametrize("late", ["approved", "rejected"])
async def test_a_late_decision_on_a_closed_request_is_refused_and_writes_nothing(
    store: Store, make_task: MakeTask, late: str
) -> None:
    await _waiting_with_requests(store, make_task)
    (a,) = [x for x in await store.get_approvals("t") if x.request_id == "a"]
    events, patch = abandon()
    await store.commit("t", None, events, task=patch)
    seq = (await store.get_task("t")).last_seq
    with pytest.raises(errors.ConcurrentUpdate, match="already closed: task abandoned"):
        await store.commit(
            "t",
            None,
            [ev.ApprovalDecided(request_id="a", decision="approve", by="bo")],
            approvals=[decided(a, late)],
        )
    (after,) = [x for x in await store.get_approvals("t") if x.request_id == "a"]
    assert after.status == "closed"
    assert (await store.get_task("t")).last_seq == seq


async def test_a_decided_request_is_not_decided_again(store: Store, make_task: MakeTask) -> None:
    await _waiting_with_requests(store, make_task)
    (a,) = [x for x in await store.get_approvals("t") if x.request_id == "a"]
    await store.commit("t", None, [], approvals=[decided(a, "rejected", by="ana")])
    with pytest.raises(errors.ConcurrentUpdate, match="already rejected by ana"):
        await store.commit("t", None, [], approvals=[decided(a, "approved")])
    # Writing the very same decision again is no change, and allowed.
    await store.commit("t", None, [], approvals=[decided(a, "rejected", by="ana")])


async def test_a_commit_that_does_not_end_the_task_closes_nothing(
    store: Store, make_task: MakeTask
) -> None:
    await _waiting_with_requests(store, make_task)
    await store.commit(
        "t",
        None,
        [ev.TaskStatusChanged(src="waiting", dst="queued", reason="a human decided")],
        task=TaskPatch(status="queued", waiting=None),
    )
    assert {a.status for a in await store.get_approvals("t")} == {"pending"}
    assert await store.read_events("t", types={"approval.closed"}) == []


async def test_a_refused_ending_closes_nothing(store: Store, make_task: MakeTask) -> None:
    await _waiting_with_requests(store, make_task)
    lease = await store.claim("w", 60, task_id="t")
    assert lease is not None
    events, patch = abandon()
    with pytest.raises(errors.StaleLease):
        await store.commit("t", lease.token + 5, events, task=patch)
    assert {a.status for a in await store.get_approvals("t")} == {"pending"}


async def test_approve_racing_abandon_never_leaves_an_approved_request_on_an_ended_task(
    backend: Backend, make_task: MakeTask
) -> None:
    # Two handles (two connections for the SQL stores): one approves every request it
    # read as pending, the other abandons the task. Whatever the order, the task ends
    # with every request closed: none approved and unsent.
    first = await backend.open()
    second = await backend.open() if backend.durable else first
    outcomes = set()
    try:
        for n in range(6):
            tid = f"t{n}"
            await make_task(tid)
            await _to_waiting(first, tid)
            await first.commit(
                tid,
                None,
                [ev.TaskStatusChanged(src="running", dst="waiting", reason="approval required")],
                task=TaskPatch(status="waiting", waiting={"kind": "approval"}),
                ops=[op(tid, f"{tid}-op-{r}", "awaiting_approval") for r in "ab"],
                approvals=[request(tid, f"{tid}-{r}", op_id=f"{tid}-op-{r}") for r in "ab"],
            )
            pending = await first.get_approvals(tid, statuses={"pending"})

            async def approve_all(tid: str = tid, pending: list[ApprovalRecord] = pending) -> str:
                try:
                    await first.commit(
                        tid,
                        None,
                        [
                            ev.ApprovalDecided(request_id=a.request_id, decision="approve")
                            for a in pending
                        ],
                        approvals=[decided(a, "approved") for a in pending],
                    )
                except errors.ConcurrentUpdate:
                    return "refused"
                return "approved"

            async def end(tid: str = tid) -> None:
                events, patch = abandon()
                await second.commit(tid, None, events, task=patch)

            if n % 2:
                result, _ = await asyncio.gather(approve_all(), end())
            else:
                _, result = await asyncio.gather(end(), approve_all())
            outcomes.add(result)
            got = {a.request_id: a.status for a in await first.get_approvals(tid)}
            assert set(got.values()) == {"closed"}, (result, got)
            assert (await first.get_task(tid)).status == "abandoned"
            closed = await first.read_events(tid, types={"approval.closed"})
            assert len(closed) == 2
    finally:
        if second is not first:
            await second.close()
        await first.close()
    assert outcomes <= {"approved", "refused"}


async def test_the_watchdogs_cancel_of_a_dead_workers_task_closes_its_requests(
    store: Store, make_task: MakeTask, clock: FakeClock
) -> None:
    from tether.runtime.tasks import cancel
    from tether.runtime.watch.sweep import WatchPolicy, sweep

    await make_task("t")
    lease = await store.claim("gone:1", 60, task_id="t")
    assert lease is not None
    await store.commit(
        "t",
        lease.token,
        [
            ev.TaskStatusChanged(src="queued", dst="running", reason="started"),
            ev.ApprovalRequested(request_id="a", what="write a", op_id="op-a"),
        ],
        task=TaskPatch(status="running"),
        ops=[op("t", "op-a", "awaiting_approval")],
        approvals=[request("t", "a")],
    )
    assert (await cancel(store, "t")).outcome == "requested"
    clock.advance(61)
    assert (await sweep(store, policy=WatchPolicy(stalled_after=600))).cancelled == ["t"]
    (a,) = await store.get_approvals("t")
    assert a.status == "closed"
    assert a.decision == {
        "decision": "closed",
        "reason": "task cancelled: cancelled: its worker stopped before it saw the request",
    }
    (closed,) = await store.read_events("t", types={"approval.closed"})
    assert closed.data["request_id"] == "a"
    assert (await rebuild(store, "t"))["consistent"]


@pytest.mark.parametrize(
    ("dst", "stop_reason"),
    [
        ("satisfied", "delivered"),
        ("failed", "needs_user_input"),
        ("cancelled", "cancelled_by_user"),
        ("abandoned", "max_rounds"),
    ],
)
async def test_every_ending_closes_the_requests_a_worker_leaves_open(
    store: Store, make_task: MakeTask, dst: str, stop_reason: str
) -> None:
    # The runtime's own endings, under its lease, close what is still open too.
    await make_task("t")
    lease = await store.claim("w", 60, task_id="t")
    assert lease is not None
    await store.commit(
        "t",
        lease.token,
        [
            ev.TaskStatusChanged(src="queued", dst="running", reason="started"),
            ev.ApprovalRequested(request_id="a", what="write a", op_id="op-a"),
        ],
        task=TaskPatch(status="running"),
        ops=[op("t", "op-a", "awaiting_approval")],
        approvals=[request("t", "a")],
    )
    await store.commit(
        "t",
        lease.token,
        [ev.TaskStatusChanged(src="running", dst=dst, stop_reason=stop_reason, reason="the end")],
        task=TaskPatch(status=dst, stop_reason=stop_reason, waiting=None),
    )
    (a,) = await store.get_approvals("t")
    assert (a.status, a.decision) == (
        "closed",
        {"decision": "closed", "reason": f"task {dst}: the end"},
    )
    (closed,) = await store.read_events("t", types={"approval.closed"})
    assert closed.fencing_token == lease.token


async def test_deciding_a_closed_request_or_on_an_ended_task_says_what_settled_it(
    store: Store, make_task: MakeTask
) -> None:
    from tether import approvals, decisions

    await _waiting_with_requests(store, make_task)
    await decisions.abandon_task(store, "t", reason="gone", by="ana")
    with pytest.raises(
        errors.AlreadySettled, match="a was closed: task abandoned: abandoned by ana"
    ):
        await approvals.decide(store, "t", "a", "approve")
    assert await approvals.pending(store, "t") == []
    # A request left pending on an ended task (written by an older tether): refused too.
    await store.commit("t", None, [], approvals=[request("t", "old")])
    with pytest.raises(errors.AlreadySettled, match=r"is abandoned .* nothing to decide"):
        await approvals.decide(store, "t", "old", "reject")
    assert {a.request_id: a.status for a in await store.get_approvals("t")}["old"] == "pending"


async def test_the_library_decision_racing_abandon_never_leaves_it_approved(
    backend: Backend, make_task: MakeTask
) -> None:
    from tether import approvals, decisions

    first = await backend.open()
    second = await backend.open() if backend.durable else first
    try:
        for n in range(4):
            tid = f"r{n}"
            await make_task(tid)
            await _to_waiting(first, tid)
            await first.commit(
                tid,
                None,
                [ev.TaskStatusChanged(src="running", dst="waiting", reason="approval required")],
                task=TaskPatch(status="waiting", waiting={"kind": "approval"}),
                ops=[op(tid, f"{tid}-op", "awaiting_approval")],
                approvals=[request(tid, f"{tid}-a", op_id=f"{tid}-op")],
            )

            async def approve(tid: str = tid) -> str:
                try:
                    await approvals.decide(first, tid, f"{tid}-a", "approve", by="bo")
                except errors.AlreadySettled as exc:
                    assert "closed: task abandoned" in str(exc) or "is abandoned" in str(exc)
                    return "refused"
                return "approved"

            async def abandon(tid: str = tid) -> None:
                await decisions.abandon_task(second, tid, reason="racing", by="ana")

            if n % 2:
                await asyncio.gather(approve(), abandon())
            else:
                await asyncio.gather(abandon(), approve())
            (a,) = await first.get_approvals(tid)
            assert a.status == "closed", a
            assert (await first.get_task(tid)).status == "abandoned"
            assert (await rebuild(first, tid))["consistent"]
    finally:
        if second is not first:
            await second.close()
        await first.close()


async def test_an_approval_acted_on_before_a_later_request_stays_approved(
    store: Store, make_task: MakeTask, clock: FakeClock
) -> None:
    # "Try again" was approved and acted on; the call failed again and a new request
    # asks about the same op: ending the task closes the new one only.
    await make_task("t")
    await _to_waiting(store, "t")
    first = request("t", "e1", op_id="op-x", created_at=clock.now())
    await store.commit(
        "t",
        None,
        [ev.ApprovalRequested(request_id="e1", what="again?", op_id="op-x")],
        ops=[op("t", "op-x", "awaiting_approval")],
        approvals=[first],
    )
    await store.commit(
        "t",
        None,
        [ev.ApprovalDecided(request_id="e1", decision="approve", by="bo")],
        approvals=[decided(first, "approved")],
    )
    clock.advance(1)
    await store.commit(
        "t",
        None,
        [ev.ApprovalRequested(request_id="e2", what="again?", op_id="op-x")],
        approvals=[request("t", "e2", op_id="op-x", created_at=clock.now())],
    )
    events, patch = abandon(src="running")
    await store.commit("t", None, events, task=patch)
    got = {a.request_id: a.status for a in await store.get_approvals("t")}
    assert got == {"e1": "approved", "e2": "closed"}
    assert (await rebuild(store, "t"))["consistent"]
