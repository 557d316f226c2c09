"""Property tests of the goal ledger: any sequence of transitions keeps its invariants.

A small reference model (plain dicts) says what each transition should do; every
step checks the ledger against it and against the invariants:

- an item is `done` only with evidence;
- the version rises by exactly one iff the diff is non-empty, and the diff describes
  exactly the fields that changed;
- a refused transition (unknown item, `done` without evidence, unknown status) raises
  `LedgerError` and leaves the ledger as it was;
- rendering is deterministic, also for a ledger rebuilt from its stored parts;
- `to_dict` and `render_json` carry the whole ledger.
"""

from __future__ import annotations

import contextlib
import copy
import json
from dataclasses import dataclass
from typing import Any, cast

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether import errors, ledger
from tether.ledger import ITEM_STATUSES, ItemChange, Ledger, Skeleton

GHOST = "ghost-item"
EVIDENCE = ["op:1", "op:2", "op:3", "art:report", "art:csv"]

Model = dict[str, dict[str, Any]]


# --- strategies -----------------------------------------------------------------------

ids = st.text(alphabet="abcdefgh0123-", min_size=1, max_size=6)
texts = st.text(max_size=24)
evidence_lists = st.lists(st.sampled_from(EVIDENCE), max_size=3, unique=True)


@st.composite
def skeletons(draw: st.DrawFn) -> Skeleton:
    item_ids = draw(st.lists(ids, min_size=1, max_size=6, unique=True))
    ms_ids = draw(st.lists(st.sampled_from(["m1", "m2", "m3"]), max_size=3, unique=True))
    items = tuple(
        ledger.ItemDef(
            i, draw(st.text(min_size=1, max_size=20)), draw(st.sampled_from([None, *ms_ids]))
        )
        for i in item_ids
    )
    milestones = tuple((m, draw(texts)) for m in ms_ids)
    acceptance = tuple(
        (f"acc{n}", draw(st.text(min_size=1, max_size=20))) for n in range(draw(st.integers(0, 2)))
    )
    return Skeleton(draw(texts), items, acceptance, milestones)


@dataclass(frozen=True)
class Op:
    """One transition to try."""

    kind: str
    item: str
    evidence: tuple[str, ...] = ()
    text: str = ""
    value: int = 0
    batch: tuple[ItemChange, ...] = ()


@st.composite
def item_changes(draw: st.DrawFn, item_ids: list[str]) -> ItemChange:
    return ItemChange(
        item_id=draw(st.sampled_from([*item_ids * 4, GHOST])),
        status=cast(Any, draw(st.sampled_from([None, *ITEM_STATUSES] * 4 + ["finished"]))),
        evidence=tuple(draw(evidence_lists)),
        note=draw(st.none() | texts),
        attempts_delta=draw(st.integers(-2, 2)),
        breaker=draw(st.none() | st.integers(-1, 5)),
    )


@st.composite
def ops(draw: st.DrawFn, item_ids: list[str]) -> Op:
    kind = draw(
        st.sampled_from(
            ["apply", "start", "complete", "block", "skip", "reopen", "attempt", "breaker"]
        )
    )
    # Mostly known items, sometimes one the skeleton does not declare.
    item = draw(st.sampled_from([*item_ids * 6, GHOST]))
    if kind == "apply":
        batch = tuple(draw(st.lists(item_changes(item_ids), min_size=1, max_size=3)))
        return Op(kind, item, batch=batch)
    return Op(
        kind,
        item,
        evidence=tuple(draw(evidence_lists)),
        text=draw(texts),
        value=draw(st.integers(-3, 6)),
    )


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Skeleton, list[Op]]:
    sk = draw(skeletons())
    item_ids = [d.id for d in sk.items]
    return sk, draw(st.lists(ops(item_ids), max_size=30))


# --- the reference model ----------------------------------------------------------------


def as_changes(op: Op) -> list[ItemChange]:
    """The `apply` batch a named transition stands for (as its docstring says)."""
    if op.kind == "apply":
        return list(op.batch)
    if op.kind == "complete":
        return [ItemChange(op.item, status="done", evidence=op.evidence, note=op.text or None)]
    if op.kind == "block":
        return [ItemChange(op.item, status="blocked", note=op.text)]
    if op.kind == "skip":
        return [ItemChange(op.item, status="skipped", note=op.text)]
    if op.kind == "reopen":
        return [ItemChange(op.item, status="pending", note=op.text, breaker=0)]
    if op.kind == "attempt":
        return [ItemChange(op.item, attempts_delta=1, note=op.text or None)]
    if op.kind == "breaker":
        return [ItemChange(op.item, breaker=op.value)]
    raise AssertionError(op.kind)


class Refused(Exception):
    pass


def model_apply(model: Model, op: Op) -> Model:
    """What the ledger's state should become; `Refused` when it must refuse."""
    new = copy.deepcopy(model)
    if op.kind == "start":
        if op.item not in new:
            raise Refused
        if new[op.item]["status"] == "pending":
            new[op.item]["status"] = "in_progress"
        return new
    for ch in as_changes(op):
        if ch.item_id not in new:
            raise Refused
        s = new[ch.item_id]
        was_done = s["status"] == "done"
        for e in ch.evidence:
            if e not in s["evidence"]:
                s["evidence"].append(e)
        if ch.status is not None:
            if ch.status not in ITEM_STATUSES:
                raise Refused
            if ch.status == "done" and not s["evidence"]:
                raise Refused
            if ch.status == "pending" and was_done:
                s["evidence"] = []
            s["status"] = ch.status
        if ch.note is not None:
            s["note"] = ch.note
        s["attempts"] = max(0, s["attempts"] + ch.attempts_delta)
        if ch.breaker is not None:
            s["breaker"] = max(0, ch.breaker)
    return new


def run(led: Ledger, op: Op) -> ledger.LedgerUpdate:
    if op.kind == "apply":
        return ledger.apply(led, op.batch)
    if op.kind == "start":
        return ledger.start(led, op.item)
    if op.kind == "complete":
        return ledger.complete(led, op.item, op.evidence, op.text)
    if op.kind == "block":
        return ledger.block(led, op.item, op.text)
    if op.kind == "skip":
        return ledger.skip(led, op.item, op.text)
    if op.kind == "reopen":
        return ledger.reopen(led, op.item, op.text)
    if op.kind == "attempt":
        return ledger.record_attempt(led, op.item, op.text or None)
    if op.kind == "breaker":
        return ledger.set_breaker(led, op.item, op.value)
    raise AssertionError(op.kind)


def model_of(led: Ledger) -> Model:
    return {
        d.id: {
            "status": s.status,
            "evidence": list(s.evidence),
            "attempts": s.attempts,
            "breaker": s.breaker,
            "note": s.note,
        }
        for d, s in led.items()
    }


# --- invariants ---------------------------------------------------------------------------


def rebuilt(led: Ledger) -> Ledger:
    """The ledger as the store would give it back: JSON parts and a version."""
    sk = json.loads(json.dumps(led.skeleton.to_dict()))
    state = json.loads(json.dumps(led.state_dict()))
    return Ledger.from_parts(sk, state, led.version)


def from_public_json(text: str) -> Ledger:
    """Rebuild a ledger from `render_json` alone: it must carry everything."""
    d = json.loads(text)
    sk = {
        "objective": d["objective"],
        "acceptance": d["acceptance"],
        "milestones": d["milestones"],
        "items": [
            {"id": i["id"], "title": i["title"], "milestone": i["milestone"]} for i in d["items"]
        ],
    }
    state = {i["id"]: i for i in d["items"]}
    return Ledger.from_parts(sk, state, d["version"])


def check_ledger(led: Ledger) -> None:
    ledger.check_invariants(led)
    for d, s in led.items():
        if s.status == "done":
            assert s.evidence, f"{d.id} done without evidence"
        assert s.attempts >= 0 and s.breaker >= 0
        assert s.status in ITEM_STATUSES
    text = led.render()
    assert text == led.render()
    again = rebuilt(led)
    assert again == led
    assert again.render() == text
    assert again.render_json() == led.render_json()
    assert json.loads(led.render_json()) == led.to_dict()
    assert from_public_json(led.render_json()) == led
    p = led.progress()
    assert p.total == len(led.skeleton.items)
    assert p.done + p.pending + p.in_progress + p.blocked + p.skipped + p.waived == p.total
    assert led.open_items() == [
        d.id for d, s in led.items() if s.status in ("pending", "in_progress")
    ]
    nxt = led.next_item()
    assert (nxt is None) == (not led.open_items())


def check_diff(before: Ledger, update: ledger.LedgerUpdate) -> None:
    after = update.ledger
    assert update.changed == bool(update.diff) == bool(update.diff.changes)
    if update.diff:
        assert after.version == before.version + 1
    else:
        assert after.version == before.version
        assert after == before
    # Replaying the diff's field changes, in order, over the old state gives the new.
    replay = model_of(before)
    for ch in update.diff.changes:
        assert ch.before != ch.after
        cur = replay[ch.item_id][ch.field]
        assert (tuple(cur) if isinstance(cur, list) else cur) == ch.before
        replay[ch.item_id][ch.field] = list(ch.after) if ch.field == "evidence" else ch.after
    assert replay == model_of(after)
    json.dumps(update.diff.to_list())  # JSON-ready
    assert after.skeleton == before.skeleton


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_any_sequence_of_transitions_keeps_the_invariants(
    scenario: tuple[Skeleton, list[Op]],
) -> None:
    sk, steps = scenario
    led = Ledger.new(sk)
    model = model_of(led)
    check_ledger(led)
    for op in steps:
        before = led
        snapshot = (led.render(), led.render_json(), copy.deepcopy(led.state_dict()))
        try:
            expected = model_apply(model, op)
        except Refused:
            expected = None
        try:
            update = run(led, op)
        except errors.LedgerError:
            assert expected is None, f"{op} was refused but should pass"
            # Nothing changed: the same object, the same bytes.
            assert led == before
            assert (led.render(), led.render_json(), led.state_dict()) == snapshot
            continue
        assert expected is not None, f"{op} should have been refused"
        check_diff(before, update)
        led = update.ledger
        assert model_of(led) == expected
        model = expected
        # The old ledger value is untouched by the transition.
        assert (before.render(), before.render_json(), before.state_dict()) == snapshot
        check_ledger(led)


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_same_state_renders_the_same_whatever_the_path(
    scenario: tuple[Skeleton, list[Op]],
) -> None:
    # Two ledgers reaching the same state and version by different objects render
    # byte-identically.
    sk, steps = scenario
    led = Ledger.new(sk)
    for op in steps:
        with contextlib.suppress(errors.LedgerError):
            led = run(led, op).ledger
    twin = Ledger(
        Skeleton.from_dict(sk.to_dict()),
        tuple(ledger.ItemState.from_dict(s) for s in led.state_dict().values()),
        led.version,
    )
    assert twin.render() == led.render()
    assert twin.render_json() == led.render_json()
    assert twin.render().encode("utf-8") == led.render().encode("utf-8")


@settings(max_examples=200, deadline=None)
@given(skeletons(), st.lists(st.sampled_from(EVIDENCE), min_size=1, max_size=6))
def test_evidence_refs_stay_unique(sk: Skeleton, refs: list[str]) -> None:
    # Evidence is a set of refs kept in arrival order: no ref appears twice, whether it
    # is repeated across changes or within one change.
    item = sk.items[0].id
    led = ledger.complete(Ledger.new(sk), item, refs).ledger
    assert len(set(led.item(item).evidence)) == len(led.item(item).evidence)
    assert set(led.item(item).evidence) == set(refs)
    again = ledger.complete(led, item, refs)
    assert not again.changed
