"""A person's sign-off before delivery (`review: human`): approve or reject the work.

When the completion check passes and the contract wants a person to sign off, the task
waits (kind `decision`, `signoff: true`) with the execution report. `approve` records
the sign-off for the ledger as it stands and queues the task: the runtime delivers it
(`satisfied`) at its next turn without asking the models again. `reject` sends the named
items back to work (`--reopen ITEM`, or the items the hint names) and the hint reaches
the model as a message from the person; when the work is complete again, the task waits
for sign-off again. Both are journaled (`signoff.decided`) with who decided.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from tether import errors, lifecycle
from tether import events as ev
from tether import ledger as L
from tether._validation import free_text
from tether.decisions import MAX_REASON_CHARS, changeable
from tether.runtime.run.state import RunState
from tether.store.base import LedgerWrite, Store, TaskPatch, TaskRecord


async def waiting_for_signoff(store: Store, task_id: str, verb: str) -> TaskRecord:
    """The task, if it waits for a person's sign-off; else a `UserError` saying so."""
    task = await changeable(store, task_id, verb)
    waiting = task.waiting or {}
    decision = waiting.get("kind") == "decision" and not waiting.get("signoff")
    if task.status == "waiting" and decision and waiting.get("reason"):
        # What answers the wait (retry, waive, abandon) is in its reason.
        raise errors.UserError(
            f"task {task_id} does not wait for a sign-off: it waits for a decision: "
            f"{waiting['reason']}"
        )
    if task.status != "waiting" or not waiting.get("signoff"):
        raise errors.UserError(
            f"task {task_id} does not wait for a sign-off (it is {task.status}); "
            f"to answer an approval request, name it: tether {verb} {task_id} REQUEST "
            f"(tether approvals {task_id} lists them)"
        )
    return task


async def approve(store: Store, task_id: str, *, by: str = "user") -> TaskRecord:
    """Sign off on the work as reported: the task is queued and delivered at its next
    turn (by a worker, or `tether resume`)."""
    task = await waiting_for_signoff(store, task_id, "approve")
    ledger = (await store.get_ledger(task_id)).to_ledger()
    state = RunState.from_dict(task.usage)
    state.signed_off = {"ledger_version": ledger.version, "by": by}
    change, moved = lifecycle.transition(task, "queued", f"signed off by {by}")
    decided = ev.SignoffDecided(decision="approve", by=by, ledger_version=ledger.version)
    await store.commit(
        task_id, None, [decided, change], task=TaskPatch(**moved, usage=state.to_dict())
    )
    return await store.get_task(task_id)


def named_items(ledger: L.Ledger, text: str) -> list[str]:
    """The ledger's item ids that `text` names (as whole words), in ledger order."""
    return [
        d.id
        for d, _ in ledger.items()
        if re.search(rf"(?<![\w.-]){re.escape(d.id)}(?![\w-]|\.\w)", text)
    ]


async def reject(
    store: Store,
    task_id: str,
    *,
    hint: str,
    reopen: Sequence[str] = (),
    by: str = "user",
) -> L.Ledger:
    """Refuse the sign-off: the items in `reopen` (or, without it, those `hint` names)
    go back to work, and `hint` reaches the model in its next request."""
    task = await waiting_for_signoff(store, task_id, "reject")
    text = free_text(hint, "the hint", limit=MAX_REASON_CHARS)
    if not text:
        raise errors.UserError("a rejected sign-off needs a hint for the model (--hint TEXT)")
    ledger = (await store.get_ledger(task_id)).to_ledger()
    known = [d.id for d, _ in ledger.items()]
    unknown = [r for r in reopen if r not in known]
    if unknown:
        raise errors.UserError(
            f"task {task_id} has no item {unknown[0]!r} (items: {', '.join(known)})"
        )
    items = list(dict.fromkeys(reopen)) or named_items(ledger, text)
    if not items:
        raise errors.UserError(
            "name the items to redo: --reopen ITEM (or name them in the hint); "
            f"items: {', '.join(known)}"
        )
    before = ledger
    diff: list[dict[str, object]] = []
    for item in items:
        update = L.reopen(ledger, item, f"sign-off rejected by {by}: {text}"[:500])
        ledger, diff = update.ledger, diff + update.diff.to_list()
    state = RunState.from_dict(task.usage)
    state.signed_off = None
    for item in items:
        state.credited.pop(item, None)
        state.proposals.pop(item, None)
    change, moved = lifecycle.transition(task, "queued", f"sign-off rejected by {by}")
    events: list[ev.Event] = [
        ev.SignoffDecided(
            decision="reject", by=by, hint=text, reopen=items, ledger_version=before.version
        ),
        ev.UserMessage(text=f"The sign-off was rejected; redo {', '.join(items)}: {text}", by=by),
        ev.LedgerUpdated(version=ledger.version, diff=diff, cause="signoff"),
        change,
    ]
    await store.commit(
        task_id,
        None,
        events,
        task=TaskPatch(**moved, usage=state.to_dict()),
        ledger=LedgerWrite.of(ledger, before.version),
    )
    return ledger


async def take_again(store: Store, task_id: str, data: Mapping[str, Any], *, by: str) -> None:
    """Take a recorded `signoff.decided` again (`tether replay`)."""
    if data.get("decision") == "approve":
        await approve(store, task_id, by=by)
    else:
        hint, items = str(data.get("hint", "")), [str(i) for i in data.get("reopen", [])]
        await reject(store, task_id, hint=hint, reopen=items, by=by)
