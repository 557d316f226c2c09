"""Shared pieces of the adversarial tests: contracts, judge payload helpers, and the
honesty oracle every test (and the property test) checks a task against.

The oracle does not trust the audit: it recomputes from the stored journal (ops,
artifacts, `round.started` events) whether each `done` item holds evidence that
resolves and belongs to it, and whether the task's terminal state is allowed by the
ledger.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from tests.support.loop import events_of, ledger_of
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import tool_call
from tether.runtime.ops.runner import history_only
from tether.runtime.tasks import status_dict
from tether.spec import (
    ArtifactRule,
    ChecklistItem,
    CommandRule,
    FileRule,
    OpRule,
    TaskSpec,
    parse_spec,
)
from tether.store.base import ArtifactRecord, OpRecord, Store

FILE_TOOLS = ["write_file", "read_file", "list_files"]


# --- contracts ----------------------------------------------------------------------------


def contract(items: Sequence[Mapping[str, Any]], **extra: Any) -> TaskSpec:
    """A contract with these items; file tools allowed unless `tools` is given."""
    data: dict[str, Any] = {
        "name": "adversarial",
        "objective": extra.pop("objective", "finish every checklist item honestly"),
        "items": [dict(i) for i in items],
        "tools": extra.pop("tools", list(FILE_TOOLS)),
    }
    data.update(extra)
    return parse_spec(data)


def plain_items(*ids: str) -> list[dict[str, Any]]:
    """Items without `done_when` rules (an LLM judge decides them, under the audit)."""
    return [{"id": i, "title": f"produce the {i} deliverable"} for i in ids]


def op_rule_items(*ids: str) -> list[dict[str, Any]]:
    """Items done when `write_file` wrote `out/<id>.txt` (an op rule)."""
    return [
        {
            "id": i,
            "title": f"write out/{i}.txt",
            "done_when": {"kind": "op", "tool": "write_file", "args": {"path": f"out/{i}.txt"}},
        }
        for i in ids
    ]


# --- what the judge and the actor see -----------------------------------------------------


def payload(request: ModelRequest) -> dict[str, Any]:
    """The judge's JSON payload."""
    data: dict[str, Any] = json.loads(request.messages[0].content)
    return data


def journal(request: ModelRequest) -> list[dict[str, Any]]:
    """This round's op journal, as the judge sees it."""
    return list(payload(request)["op_journal"])


def refs(
    request: ModelRequest, *, status: str | None = "succeeded", tool: str | None = None
) -> list[str]:
    """Evidence refs of this round's ops (of a status / tool)."""
    return [
        o["evidence_ref"]
        for o in journal(request)
        if (status is None or o["status"] == status) and (tool is None or o["tool"] == tool)
    ]


def open_ids(request: ModelRequest) -> list[str]:
    """Ids of the items the judge's compact ledger lists as not done."""
    return [i["id"] for i in payload(request)["ledger"]["items"]]


def all_ids(request: ModelRequest) -> list[str]:
    """Every item id, from the structured ledger on the request."""
    assert request.ledger is not None, "requests must carry the ledger as data"
    return [i["id"] for i in request.ledger["items"]]


def verdict(
    changes: Iterable[Mapping[str, Any]] = (), decision: str = "continue", reason: str = ""
) -> str:
    """A judge's answer."""
    return json.dumps({"changes": list(changes), "decision": decision, "reason": reason})


def change(
    item: str, status: str | None = None, evidence: Sequence[str] = (), note: str | None = None
) -> dict[str, Any]:
    """One proposed change."""
    out: dict[str, Any] = {"item": item, "evidence": list(evidence)}
    if status is not None:
        out["status"] = status
    if note is not None:
        out["note"] = note
    return out


def write(item: str, content: str | None = None) -> Any:
    """A `write_file` call for `out/<item>.txt`."""
    return tool_call("write_file", path=f"out/{item}.txt", content=content or f"{item}\n")


def say(text: str, *calls: Any) -> ModelResponse:
    """An actor reply."""
    return ModelResponse(text, tuple(calls))


def first_then(
    first: ModelResponse, then: ModelResponse
) -> Callable[[ModelRequest], ModelResponse]:
    """An actor that answers its first request with `first` and every later one with
    `then` (an odd answer once, then honest work)."""
    asked = 0

    def actor(request: ModelRequest) -> ModelResponse:
        nonlocal asked
        asked += 1
        return first if asked == 1 else then

    return actor


def nested(levels: int, leaf: Any = "x") -> Any:
    """`leaf` wrapped in `levels` one-element lists."""
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


def act_requests(model: Any) -> list[ModelRequest]:
    """The act requests a scripted model answered."""
    return [r for r in model.requests if r.purpose == "act"]


def all_text(request: ModelRequest) -> str:
    """Everything the model was shown (system prompt and messages)."""
    return request.system + "\n" + "\n".join(m.content for m in request.messages)


# --- reading a task back --------------------------------------------------------------------


def next_of(request: ModelRequest) -> str | None:
    """The item the runtime says is next (None: every item finished)."""
    return request.ledger["next"] if request.ledger else None


def registry_with(store: Store, *tools: Any) -> Any:
    """tether's default tools (bound to `store`) and `tools`."""
    from tether.tools.builtin.files import default_registry

    reg = default_registry(lambda: store)
    for t in tools:
        reg.add(t)
    return reg


async def rounds_of(store: Store, task_id: str, item: str) -> int:
    """How many rounds had `item` as their focus."""
    return sum(1 for r in await events_of(store, task_id, "round.started") if r["item"] == item)


async def blocked_note(store: Store, task_id: str, item: str) -> str:
    """The note of `item`, which must be blocked."""
    st = (await ledger_of(store, task_id)).item(item)
    assert st.status == "blocked", (item, st.status, st.note)
    return st.note or ""


async def statuses(store: Store, task_id: str) -> dict[str, str]:
    """Item id -> status, from the stored ledger."""
    return {d.id: s.status for d, s in (await ledger_of(store, task_id)).items()}


async def warnings(store: Store, task_id: str, code: str | None = None) -> list[Mapping[str, Any]]:
    """`audit.warning` event data (of one code)."""
    found = await events_of(store, task_id, "audit.warning")
    return [w for w in found if code is None or w["code"] == code]


async def warning_codes(store: Store, task_id: str) -> set[str]:
    """The distinct codes of the task's audit warnings."""
    return {w["code"] for w in await warnings(store, task_id)}


async def warned_items(store: Store, task_id: str, code: str) -> set[str]:
    """Items named by warnings of one code."""
    return {w["details"].get("item") for w in await warnings(store, task_id, code)} - {None}


async def focus_by_round(store: Store, task_id: str) -> dict[int, str | None]:
    """The focus item of every round, from the `round.started` events."""
    return {
        int(e["round"]): e.get("item") for e in await events_of(store, task_id, "round.started")
    }


async def terminal_transitions(store: Store, task_id: str) -> list[Mapping[str, Any]]:
    """`task.status` events into a terminal state."""
    return [
        e
        for e in await events_of(store, task_id, "task.status")
        if e["dst"] in ("satisfied", "abandoned", "failed", "cancelled")
    ]


# --- the oracle -----------------------------------------------------------------------------


def _matches_rule(item: ChecklistItem, op: OpRecord) -> bool:
    rule = item.done_when
    return (
        isinstance(rule, OpRule)
        and op.tool == rule.tool
        and all(k in op.args and op.args[k] == v for k, v in rule.args.items())
    )


def proves(
    ref: str,
    item: ChecklistItem,
    ops: Mapping[str, OpRecord],
    arts: Mapping[str, ArtifactRecord],
    focus: Mapping[int, str | None],
) -> bool:
    """Whether `ref` resolves (a succeeded op or a valid artifact of the task) and
    belongs to `item` (its rule's result, made while it was the focus, or linked)."""
    kind, _, ident = ref.partition(":")
    links = item.evidence_from
    if kind == "op":
        op = ops.get(ident)
        if op is None:
            return False
        return focus.get(op.round) == item.id or op.tool in links.tools or _matches_rule(item, op)
    if kind == "artifact":
        art = arts.get(ident)
        if art is None:
            return False
        if art.source == "rule judge" and art.name == item.id:
            return True
        if art.name in links.artifacts or (
            isinstance(item.done_when, ArtifactRule) and art.name == item.done_when.name
        ):
            return True
        made_by = ops.get(art.source or "")
        if art.kind == "tool_output":
            return made_by is not None and (
                focus.get(made_by.round) == item.id or made_by.tool in links.tools
            )
        return False
    return False


async def assert_honest(store: Store, task_id: str, spec: TaskSpec) -> None:
    """The task's stored state obeys honest completion, recomputed from the journal:

    - every `done` item holds at least one ref that resolves and belongs to it, and an
      item with an op rule holds an op its rule matches;
    - a ref held by two items is allowed only when one of them shares evidence;
    - `waived` only by a human (an `item.waived` event), `skipped` only when optional,
      `blocked` only by the runtime (an `item_blocked` warning);
    - `satisfied` only with every item finished, with the matching stop reason;
    - `waiting` for a decision only with nothing open and something unfinished, and a
      partial record that matches the ledger.
    """
    task = await store.get_task(task_id)
    led = await ledger_of(store, task_id)
    items = {i.id: i for i in spec.items}
    # An op undone since (compensated, ended by a human) or a late result proves nothing.
    ops = {
        o.op_id: o
        for o in await store.get_ops(task_id, statuses={"succeeded"})
        if not history_only(o)
    }
    arts = {a.artifact_id: a for a in await store.get_artifacts(task_id) if a.valid}
    focus = await focus_by_round(store, task_id)
    waived_by_human = {e["item"] for e in await events_of(store, task_id, "item.waived")}
    blocked_by_runtime = await warned_items(store, task_id, "item_blocked")
    holders: dict[str, set[str]] = defaultdict(set)
    for d, s in led.items():
        item = items[d.id]
        for ref in s.evidence:
            holders[ref].add(d.id)
        if s.status == "done":
            proof = [r for r in s.evidence if proves(r, item, ops, arts, focus)]
            assert proof, f"{d.id} is done without evidence of its own: {s.evidence}"
            if isinstance(item.done_when, OpRule):
                assert any(
                    r.startswith("op:") and r[3:] in ops and _matches_rule(item, ops[r[3:]])
                    for r in s.evidence
                ), f"{d.id} is done but no evidence meets its op rule: {s.evidence}"
            elif isinstance(item.done_when, FileRule | CommandRule):
                assert any(
                    r.startswith("artifact:")
                    and (a := arts.get(r[9:])) is not None
                    and a.source == "rule judge"
                    and a.name == d.id
                    for r in s.evidence
                ), f"{d.id} is done but not by its rule: {s.evidence}"
        elif s.status == "waived":
            assert d.id in waived_by_human, f"{d.id} waived, but no human waived it"
        elif s.status == "skipped":
            assert item.optional, f"{d.id} skipped but the contract does not make it optional"
        elif s.status == "blocked":
            assert d.id in blocked_by_runtime, f"{d.id} blocked, but not by the runtime"
    for ref, held in holders.items():
        if len(held) > 1:
            assert any(items[i].shared_evidence for i in held), (
                f"{ref} proves {sorted(held)} but none of them may share evidence"
            )
    if task.status == "satisfied":
        assert not led.gaps(), f"satisfied with unfinished items {led.gaps()}"
        want = "delivered_with_waivers" if led.waivers() else "delivered"
        assert task.stop_reason == want, (task.stop_reason, want)
    waiting = task.waiting or {}
    if task.status == "waiting" and waiting.get("kind") == "decision":
        assert not led.open_items(), "a decision was requested with items still open"
        assert led.gaps(), "a decision was requested with every item finished"
        assert_partial_matches(waiting["partial"], led)


def assert_partial_matches(partial: Mapping[str, Any], led: Any) -> None:
    """The partial-completion record lists the ledger's items where they are."""
    by_status: dict[str, list[str]] = defaultdict(list)
    for d, s in led.items():
        key = s.status if s.status in ("done", "blocked", "waived", "skipped") else "remaining"
        by_status[key].append(d.id)
    for key in ("done", "blocked", "waived", "skipped", "remaining"):
        assert [e["id"] for e in partial[key]] == by_status.get(key, []), key
    for entry in partial["done"]:
        assert entry["evidence"] == list(led.item(entry["id"]).evidence)
    for entry in partial["blocked"]:
        st = led.item(entry["id"])
        assert entry["reason"] == st.note and entry["attempts"] == st.attempts
        assert entry["evidence"] == list(st.evidence)


async def assert_status_agrees(store: Store, task_id: str) -> dict[str, Any]:
    """`status_dict` says what the stored task and ledger say; returns the document."""
    doc = await status_dict(store, task_id)
    task = await store.get_task(task_id)
    led = await ledger_of(store, task_id)
    assert doc["status"] == task.status
    assert doc["stop_reason"] == task.stop_reason
    assert doc["waiting"] == task.waiting
    assert doc["ledger"]["version"] == led.version
    assert doc["ledger"]["progress"] == led.progress().to_dict()
    assert [
        (i["id"], i["status"], i["evidence"], i["attempts"], i["breaker"], i["note"])
        for i in doc["ledger"]["items"]
    ] == [(d.id, s.status, list(s.evidence), s.attempts, s.breaker, s.note) for d, s in led.items()]
    assert doc["waivers"] == [
        {"id": d.id, "status": s.status, "reason": s.note}
        for d, s in led.items()
        if s.status in ("waived", "skipped")
    ]
    return doc
