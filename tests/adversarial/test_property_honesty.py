"""Property: whatever the actor does and whatever the judge answers, a task reaches
`satisfied` only when every item is done with evidence that resolves and belongs to it,
or waived by a human, or optional and skipped; and `status_dict` agrees with the stored
ledger.

Hypothesis draws a small contract (1-4 items: op rules, file rules or none, optional,
shared evidence, evidence linked by tool), an actor script (calls of the file tools that
succeed or fail, an unknown tool, a big read that becomes an artifact, text claiming
completion) and a judge script (any status including waived, any decision, evidence
refs from this round, from earlier rounds, other items' evidence, made-up refs, other
tasks' refs), then runs the task on a fresh `MemoryStore` with a few human decisions
in between, checking the oracle of `tests.support.adversarial.assert_honest` after every run.
"""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tether
from tests.support.adversarial import (
    assert_honest,
    assert_status_agrees,
    contract,
    payload,
    verdict,
    write,
)
from tests.support.loop import ledger_of, run_task
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.store.memory import MemoryStore

IDS = ("p", "q", "r", "s")
STATUSES = (None, "pending", "in_progress", "done", "blocked", "skipped", "waived")
DECISIONS = ("continue", "satisfied", "abandon", "need_user")
CLAIMS = ("", "working on it", "All items are complete.", "Everything is done, ship it.")

# --- contracts ------------------------------------------------------------------------------


@st.composite
def items_st(draw: Any) -> list[dict[str, Any]]:
    n = draw(st.integers(1, 4))
    out = []
    for item_id in IDS[:n]:
        item: dict[str, Any] = {"id": item_id, "title": f"item {item_id}"}
        kind = draw(st.sampled_from(["plain", "plain", "op", "file"]))
        if kind == "op":
            item["done_when"] = {
                "kind": "op",
                "tool": "write_file",
                "args": draw(st.sampled_from([{"path": f"out/{item_id}.txt"}, {}])),
            }
        elif kind == "file":
            item["done_when"] = {"kind": "file", "path": f"out/{item_id}.txt"}
        if draw(st.booleans()):
            item["optional"] = True
        if draw(st.booleans()):
            item["shared_evidence"] = True
        links = draw(
            st.lists(
                st.sampled_from(["write_file", "list_files", "read_file"]), max_size=2, unique=True
            )
        )
        artifacts = draw(st.lists(st.sampled_from(["read_file output", "p", "q"]), max_size=1))
        if links or artifacts:
            item["evidence_from"] = {"tools": links, "artifacts": artifacts}
        out.append(item)
    return out


# --- actor script ---------------------------------------------------------------------------

CALLS = st.one_of(
    st.tuples(st.just("write_focus"), st.just(0)),
    st.tuples(st.just("write"), st.integers(0, 4)),
    st.tuples(st.just("read_ok"), st.integers(0, 2)),
    st.tuples(st.just("read_bad"), st.integers(0, 1)),
    st.tuples(st.just("read_big"), st.just(0)),
    st.tuples(st.just("list"), st.just(0)),
    st.tuples(st.just("escape"), st.just(0)),
    st.tuples(st.just("ghost"), st.just(0)),
)
REPLIES = st.tuples(st.sampled_from(CLAIMS), st.lists(CALLS, max_size=3))


def make_call(kind: str, k: int, focus: str | None) -> Any:
    if kind == "write_focus":
        return write(focus or "nothing")
    if kind == "write":
        return write(IDS[k] if k < len(IDS) else "elsewhere")
    if kind == "read_ok":
        return tool_call("read_file", path=f"seed{k}.txt")
    if kind == "read_bad":
        return tool_call("read_file", path=f"missing{k}.txt")
    if kind == "read_big":
        return tool_call("read_file", path="big.txt")
    if kind == "list":
        return tool_call("list_files", path=".")
    if kind == "escape":
        return tool_call("write_file", path="../escape.txt", content="x")
    return tool_call("deploy_prod", target="everything")


# --- judge script ---------------------------------------------------------------------------

REFS = st.one_of(
    st.tuples(st.just("this"), st.integers(0, 3)),
    st.tuples(st.just("this"), st.just(0)),
    st.tuples(st.just("this_artifact"), st.integers(0, 3)),
    st.tuples(st.just("earlier"), st.integers(0, 20)),
    st.tuples(st.just("other_item"), st.integers(0, 3)),
    st.tuples(st.just("made_up"), st.integers(0, 2)),
    st.tuples(st.just("other_task"), st.integers(0, 3)),
)
CHANGES = st.tuples(
    st.sampled_from([-1, -1, -1, 0, 1, 2, 3, -2]),  # item index; -1 the focus; -2 unknown
    st.sampled_from([*STATUSES, "done", "done"]),
    st.lists(REFS, max_size=3),
)
VERDICTS = st.tuples(st.lists(CHANGES, max_size=3), st.sampled_from(DECISIONS))
HUMAN = st.lists(
    st.tuples(
        st.sampled_from(["resume", "waive_some", "waive_all", "retry", "abandon"]),
        st.integers(0, 3),
    ),
    max_size=2,
)


@dataclass
class World:
    """What the scripted judge may draw refs from."""

    other_task: list[str]
    history: list[str]


def resolve_ref(sel: tuple[str, int], request: ModelRequest, world: World) -> str:
    kind, k = sel
    ops = payload(request)["op_journal"]
    if kind == "this":
        return ops[k % len(ops)]["evidence_ref"] if ops else "op:none-this-round"
    if kind == "this_artifact":
        arts = [o["artifact_id"] for o in ops if o.get("artifact_id")]
        return f"artifact:{arts[k % len(arts)]}" if arts else "artifact:none"
    if kind == "earlier":
        return world.history[k % len(world.history)] if world.history else "op:none-earlier"
    if kind == "other_item":
        assert request.ledger is not None
        held = [r for i in request.ledger["items"] for r in i["evidence"]]
        return held[k % len(held)] if held else "op:none-held"
    if kind == "made_up":
        task = request.task_id or "t"
        return ("op:made-up", f"op:{task}.r999.c0", f"artifact:{task}.ev999")[k]
    return world.other_task[k % len(world.other_task)]


def judge_policy(script: list[Any], world: World) -> Any:
    count = {"n": 0}

    def judge(request: ModelRequest) -> str:
        changes_sel, decision = script[count["n"] % len(script)]
        count["n"] += 1
        data = payload(request)
        assert request.ledger is not None
        ids = [i["id"] for i in request.ledger["items"]]
        changes = []
        for idx, status, refs_sel in changes_sel:
            if idx == -1:
                item = data["focus_item"] or ids[0]
            elif idx == -2:
                item = "not-an-item"
            else:
                item = ids[idx % len(ids)]
            change: dict[str, Any] = {
                "item": item,
                "evidence": [resolve_ref(s, request, world) for s in refs_sel],
                "note": "hypothesis says so",
            }
            if status is not None:
                change["status"] = status
            changes.append(change)
        world.history.extend(o["evidence_ref"] for o in data["op_journal"])
        return verdict(changes, decision, "drawn")

    return judge


def actor_policy(script: list[Any]) -> Any:
    count = {"n": 0}

    def actor(request: ModelRequest) -> ModelResponse:
        text, calls = script[count["n"] % len(script)]
        count["n"] += 1
        focus = request.ledger["next"] if request.ledger else None
        return ModelResponse(text or "...", tuple(make_call(k, n, focus) for k, n in calls))

    return actor


# --- the run --------------------------------------------------------------------------------


async def other_task_refs(store: MemoryStore, workspace: Path) -> list[str]:
    spec = contract([{"id": "p", "title": "x", "done_when": {"kind": "file", "path": "out/p.txt"}}])
    tid, _ = await run_task(
        store, spec, workspace, ScriptedModel(policy=lambda _: ModelResponse("w", (write("p"),)))
    )
    found = [f"op:{o.op_id}" for o in await store.get_ops(tid)]
    found += [f"artifact:{a.artifact_id}" for a in await store.get_artifacts(tid)]
    return found


async def check(store: MemoryStore, tid: str, spec: Any, result: Any) -> None:
    task = await store.get_task(tid)
    assert result.status == task.status
    await assert_honest(store, tid, spec)
    await assert_status_agrees(store, tid)


async def scenario(
    items: list[dict[str, Any]],
    limits: dict[str, int],
    actor_script: list[Any],
    judge_script: list[Any],
    human: list[tuple[str, int]],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ws, other_ws = root / "ws", root / "other"
        ws.mkdir()
        other_ws.mkdir()
        for n in range(3):
            (ws / f"seed{n}.txt").write_text(f"seed {n}\n")
        (ws / "big.txt").write_text("z" * 1200)
        store = await MemoryStore.open()
        world = World(other_task=await other_task_refs(store, other_ws), history=[])
        spec = contract(items, limits={"max_rounds": 8, **limits})
        judge = ScriptedModel(policy=judge_policy(judge_script, world))
        actor = ScriptedModel(policy=actor_policy(actor_script))
        tid, result = await run_task(store, spec, ws, actor, judge=judge)
        await check(store, tid, spec, result)
        for action, k in human:
            task = await store.get_task(tid)
            if task.status != "waiting":
                break
            led = await ledger_of(store, tid)
            gaps = led.gaps()
            unfinished = [g for g in gaps if led.item(g).status not in ("done", "waived")]
            if action == "abandon":
                await tether.abandon_task(store, tid, reason="enough", by="prop")
            elif action in ("waive_some", "waive_all") and unfinished:
                chosen = (
                    unfinished if action == "waive_all" else unfinished[k % len(unfinished) :][:1]
                )
                for item in chosen:
                    await tether.waive_item(store, tid, item, reason="drawn", by="prop")
            elif action == "retry" and unfinished:
                await tether.retry_item(store, tid, unfinished[k % len(unfinished)], hint="again")
            # "resume" (or nothing to decide): just run again.
            _, result = await run_task(store, spec, ws, actor, judge=judge, task_id=tid)
            await check(store, tid, spec, result)
        await store.close()


@settings(
    max_examples=50,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    items=items_st(),
    limits=st.fixed_dictionaries(
        {
            "no_progress_rounds": st.integers(1, 2),
            "same_failure_repeats": st.integers(2, 3),
            "max_attempts_per_item": st.integers(2, 3),
        }
    ),
    actor_script=st.lists(REPLIES, min_size=1, max_size=5),
    judge_script=st.lists(VERDICTS, min_size=1, max_size=5),
    human=HUMAN,
)
def test_no_script_reaches_satisfied_without_honest_evidence(
    items: list[dict[str, Any]],
    limits: dict[str, int],
    actor_script: list[Any],
    judge_script: list[Any],
    human: list[tuple[str, int]],
) -> None:
    asyncio.run(scenario(items, limits, actor_script, judge_script, human))
