"""One file shared by several items, each accepted by its own `done_when` rule.

A changelog with a section per release, a report with a part per chapter: honest work
grows or rewrites the shared file after earlier items were accepted on it. Growth (the
accepted content still the file's beginning) and the task's own rewrite that keeps
each item's text leave the earlier items done, so the task is delivered in its planned
rounds with no `deliverable_broken`; so does a rewrite by the task's own tool (a real
changelog generator: what it left is remembered, across a restart too). A rewrite that
drops an accepted item's text, and
a change from outside the task (even one that keeps the text, even when the task
appends to the file after it), reopen the item before delivery, on every store: its
rule then judges the file as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.support.loop import events_of, ledger_of, run_task
from tether.artifacts import deliverable_meta
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.runtime.engine import Engine, ModelSet
from tether.runtime.recovery import rewrites
from tether.runtime.recovery.deliverables import _Check
from tether.runtime.tasks import create_task
from tether.spec import TaskSpec, parse_spec
from tether.store.base import OpRecord, Store
from tether.tools.builtin.files import default_registry
from tether.tools.registry import Tool, tool

LOG = "CHANGELOG.md"
RELEASES = ("v0", "v1", "v2")


def section(release: str) -> str:
    return f"\n## {release}\n- what changed in {release}\n"


def spec() -> TaskSpec:
    return parse_spec(
        {
            "objective": "one changelog section per release",
            "items": [
                {
                    "id": r,
                    "title": f"the {r} section",
                    "done_when": {"kind": "file", "path": LOG, "contains": f"## {r}"},
                }
                for r in RELEASES
            ],
            "tools": ["read_file", "write_file", "append_file"],
        }
    )


Round = Callable[[Path], ModelResponse]


def plan(rounds: Sequence[Round], ws: Path) -> Callable[[ModelRequest], ModelResponse]:
    """The rounds in order, then words."""
    left = list(rounds)

    def policy(_request: ModelRequest) -> ModelResponse:
        return left.pop(0)(ws) if left else ModelResponse("that is all")

    return policy


def write(content: str) -> Round:
    return lambda _ws: ModelResponse(
        "writing", (tool_call("write_file", path=LOG, content=content),)
    )


def append(content: str) -> Round:
    return lambda _ws: ModelResponse(
        "appending", (tool_call("append_file", path=LOG, content=content),)
    )


def outside(change: Callable[[Path], None], then: Round) -> Round:
    """Someone else changes the file, then the round runs."""

    def step(ws: Path) -> ModelResponse:
        change(ws / LOG)
        return then(ws)

    return step


async def run(store: Store, ws: Path, rounds: Sequence[Round]) -> tuple[str, Any, list[str]]:
    tid, result = await run_task(
        store, spec(), ws, ScriptedModel(policy=plan(rounds, ws)), max_rounds_this_run=12
    )
    broken = [
        str(w["details"]["item"])
        for w in await events_of(store, tid, "audit.warning")
        if w["code"] == "deliverable_broken"
    ]
    return tid, result, broken


HEAD = "# Changes\n"
NEWEST_FIRST = [
    write(HEAD + "".join(section(r) for r in reversed(RELEASES[: k + 1])))
    for k in range(len(RELEASES))
]
OLDEST_FIRST = [write(HEAD + "".join(section(r) for r in RELEASES[: k + 1])) for k in range(3)]
APPENDED = [write(HEAD + section("v0")), append(section("v1")), append(section("v2"))]


@pytest.mark.parametrize(
    "rounds",
    [APPENDED, OLDEST_FIRST, NEWEST_FIRST],
    ids=["appended", "rewritten-oldest-first", "rewritten-newest-first"],
)
async def test_a_shared_file_grown_or_rewritten_by_the_task_keeps_its_items(
    store: Store, tmp_path: Path, rounds: list[Round]
) -> None:
    tid, result, broken = await run(store, tmp_path, rounds)
    assert result.status == "satisfied", (await ledger_of(store, tid)).items()
    assert broken == []
    assert len(await events_of(store, tid, "round.committed")) == len(RELEASES)


async def test_a_rewrite_that_drops_an_accepted_section_reopens_it(
    store: Store, tmp_path: Path
) -> None:
    rounds = [
        write(HEAD + section("v0")),
        write(HEAD + section("v1")),  # v0's section is gone
        write(HEAD + section("v1") + section("v2")),
    ]
    tid, result, broken = await run(store, tmp_path, rounds)
    assert broken == ["v0"]
    assert result.status != "satisfied"
    assert (await ledger_of(store, tid)).item("v0").status != "done"


def _tamper(path: Path) -> None:
    # Keeps v0's heading (the rule's text), changes what was accepted under it.
    path.write_text(HEAD + "\n## v0\n- something else entirely\n")


async def test_a_change_from_outside_breaks_even_if_the_text_stays_and_the_task_appends(
    store: Store, tmp_path: Path
) -> None:
    rounds = [
        write(HEAD + section("v0")),
        outside(_tamper, append(section("v1"))),
        append(section("v2")),
    ]
    tid, result, broken = await run(store, tmp_path, rounds)
    # Reopened before delivery; its rule then accepts the file as it is now (it still
    # has the heading the contract asks for), on evidence of that content.
    assert broken == ["v0"]
    assert result.status == "satisfied"
    arts = {a.artifact_id: a for a in await store.get_artifacts(tid)}
    evidence = (await ledger_of(store, tid)).item("v0").evidence
    accepted = [arts[r.partition(":")[2]] for r in evidence]
    assert [a.meta["sha256"] for a in accepted] == [
        deliverable_meta(LOG, (tmp_path / LOG).read_bytes())["sha256"]
    ]


async def test_a_file_that_grows_from_outside_keeps_its_item(store: Store, tmp_path: Path) -> None:
    def grow(path: Path) -> None:
        with path.open("a") as f:
            f.write("\n(a note someone added)\n")

    rounds = [
        write(HEAD + section("v0")),
        outside(grow, append(section("v1"))),
        append(section("v2")),
    ]
    tid, result, broken = await run(store, tmp_path, rounds)
    assert result.status == "satisfied", (await ledger_of(store, tid)).items()
    assert broken == []


# --- the check itself, on recorded meta ---------------------------------------------------


def _op(tool: str, content: str, round_no: int) -> OpRecord:
    return OpRecord(
        op_id=f"t.r{round_no}.c0",
        task_id="t",
        round=round_no,
        call_index=0,
        tool=tool,
        args={"path": LOG, "content": content},
        args_hash="h",
        effect="write",
        status="succeeded",
    )


def _check(ws: Path, last: OpRecord | None = None) -> _Check:
    written = {str((ws / LOG).resolve()): last} if last is not None else {}
    return _Check(ws, {}, {}, written, {})


def test_meta_of_an_older_release_is_checked_by_its_hash_alone(tmp_path: Path) -> None:
    accepted = (HEAD + section("v0")).encode()
    (tmp_path / LOG).write_bytes(accepted + b"more\n")
    old = deliverable_meta(LOG, accepted)
    del old["file_size"]  # what an earlier release recorded: path and hash only
    assert "changed since it was accepted" in str(_check(tmp_path).deliverable(LOG, old))
    assert _check(tmp_path).deliverable(LOG, deliverable_meta(LOG, accepted)) is None


def test_a_rewrite_counts_only_when_it_is_the_files_content_and_after_acceptance(
    tmp_path: Path,
) -> None:
    accepted = HEAD + section("v0")
    meta = {**deliverable_meta(LOG, accepted.encode(), "## v0"), "round": 3}
    now = HEAD + section("v1") + section("v0")
    (tmp_path / LOG).write_text(now)
    assert _check(tmp_path, _op("write_file", now, 4)).deliverable(LOG, meta) is None
    # Written in the round it was accepted, or before: not a later revision.
    assert _check(tmp_path, _op("write_file", now, 3)).deliverable(LOG, meta) is not None
    # The file is not what the task wrote (changed after the write), or the last write
    # was an append (its whole content unknown): broken.
    assert _check(tmp_path, _op("write_file", now + "x", 4)).deliverable(LOG, meta) is not None
    assert _check(tmp_path, _op("append_file", now, 4)).deliverable(LOG, meta) is not None
    # The rewrite lost the rule's text: broken.
    lost = HEAD + section("v1")
    (tmp_path / LOG).write_text(lost)
    assert _check(tmp_path, _op("write_file", lost, 4)).deliverable(LOG, meta) is not None


# --- accepted files the task's own tools rewrote (a generator, a formatter) ----------------


def _generator(ws: Path, keep_old: bool = True) -> Tool:
    """The task's own changelog generator (a write tool, not tether's file writers): it
    rewrites the whole file newest-first, with every release up to `upto` (only the last
    one when not `keep_old`)."""

    @tool(name="build_changelog", effect="write", description="Rebuild the changelog.")
    def build_changelog(upto: int) -> str:
        releases = RELEASES[: upto + 1] if keep_old else RELEASES[upto : upto + 1]
        (ws / LOG).write_text(HEAD + "".join(section(r) for r in reversed(releases)))
        return f"changelog rebuilt up to {RELEASES[upto]}"

    return build_changelog


def build(upto: int) -> Round:
    return lambda _ws: ModelResponse("rebuilding", (tool_call("build_changelog", upto=upto),))


def spec_with(items: Sequence[str], notes: bool = False) -> TaskSpec:
    rules: list[dict[str, Any]] = [
        {
            "id": r,
            "title": f"the {r} section",
            "done_when": {"kind": "file", "path": LOG, "contains": f"## {r}"},
        }
        for r in items
    ]
    if notes:
        rules.append(
            {
                "id": "notes",
                "title": "release notes",
                "done_when": {"kind": "file", "path": "NOTES.md", "contains": "notes"},
            }
        )
    return parse_spec(
        {
            "objective": "one changelog section per release, built by a script",
            "items": rules,
            "tools": ["read_file", "write_file", "build_changelog"],
        }
    )


def notes(_ws: Path) -> ModelResponse:
    return ModelResponse(
        "the notes", (tool_call("write_file", path="NOTES.md", content="release notes\n"),)
    )


async def run_own(
    store: Store,
    ws: Path,
    spec_: TaskSpec,
    rounds: Sequence[Round],
    keep_old: bool = True,
    runs: Sequence[int] = (12,),
) -> tuple[str, Any, list[str]]:
    """The task run with the generator, in runs of at most `runs` rounds each (a new
    engine, as a restarted worker, for each)."""
    registry = default_registry(lambda: store)
    registry.add(_generator(ws, keep_old))
    policy = plan(rounds, ws)
    tid = (await create_task(store, spec_, workspace=ws)).task_id
    result: Any = None
    for limit in runs:
        engine = Engine(
            store,
            ModelSet(ScriptedModel(policy=policy)),
            registry=registry,
            lease_ttl=30,
            max_rounds_this_run=limit,
        )
        result = await engine.run(tid)
    broken = [
        str(w["details"]["item"])
        for w in await events_of(store, tid, "audit.warning")
        if w["code"] == "deliverable_broken"
    ]
    # A restarted run checks the deliverables first (recovery): reopened there too.
    for step in await events_of(store, tid, "recovery.step"):
        if step["step"] == "deliverables":
            broken += [str(b["item"]) for b in step["details"]["broken"]]
    return tid, result, broken


async def test_a_file_the_tasks_own_generator_rewrote_keeps_its_items(
    store: Store, tmp_path: Path
) -> None:
    tid, result, broken = await run_own(
        store, tmp_path, spec_with(RELEASES), [build(0), build(1), build(2)]
    )
    assert result.status == "satisfied", (await ledger_of(store, tid)).items()
    assert broken == []
    assert len(await events_of(store, tid, "round.committed")) == len(RELEASES)
    # What the generator left after its last round is the task's (path, hash, round).
    task = await store.get_task(tid)
    data = (tmp_path / LOG).read_bytes()
    assert task.usage["rewritten"][LOG] == [deliverable_meta(LOG, data)["sha256"], len(data), 3]


async def test_what_the_generator_left_is_remembered_across_a_restart(
    store: Store, tmp_path: Path
) -> None:
    # The generator's last run is in the first engine's run; the second engine (a
    # restarted worker) only writes the notes, and delivers.
    tid, result, broken = await run_own(
        store,
        tmp_path,
        spec_with(RELEASES[:2], notes=True),
        [build(0), build(1), notes],
        runs=(2, 12),
    )
    assert result.status == "satisfied", (await ledger_of(store, tid)).items()
    assert broken == []


async def test_a_generator_that_drops_an_accepted_section_reopens_it(
    store: Store, tmp_path: Path
) -> None:
    _, result, broken = await run_own(
        store, tmp_path, spec_with(RELEASES), [build(0), build(1), build(2)], keep_old=False
    )
    assert "v0" in broken and "v1" in broken
    assert result.status != "satisfied"


async def test_a_change_from_outside_after_the_generator_ran_still_breaks(
    store: Store, tmp_path: Path
) -> None:
    def tamper(path: Path) -> None:  # keeps every heading, changes what is under them
        path.write_text(HEAD + "".join(f"\n## {r}\n- rewritten by someone\n" for r in RELEASES))

    rounds = [build(0), build(1), build(2), outside(tamper, notes)]
    _, result, broken = await run_own(store, tmp_path, spec_with(RELEASES, notes=True), rounds)
    assert sorted(broken) == list(RELEASES)  # reopened, then accepted as the file is now
    assert result.status == "satisfied"


def test_what_the_tasks_tools_left_holds_only_after_acceptance_and_with_the_rules_text() -> None:
    accepted = (HEAD + section("v0")).encode()
    meta = {**deliverable_meta(LOG, accepted, "## v0"), "round": 3}
    left = (HEAD + section("v1") + section("v0")).encode()
    noted = {LOG: [deliverable_meta(LOG, left)["sha256"], len(left), 4]}
    assert rewrites.holds(left, meta, noted)
    assert rewrites.holds(left + b"- grown since\n", meta, noted)  # what was left, grown
    assert not rewrites.holds(left.replace(b"v1", b"v9"), meta, noted)  # changed since
    # Noted in the round it was accepted (its hash is what it was accepted on), or before.
    assert not rewrites.holds(left, meta, {LOG: [*noted[LOG][:2], 3]})
    # What the tools left lost the rule's text.
    lost = (HEAD + section("v1")).encode()
    assert not rewrites.holds(
        lost, meta, {LOG: [deliverable_meta(LOG, lost)["sha256"], len(lost), 4]}
    )
    # Nothing noted, or a malformed note: the change stays a change.
    assert not rewrites.holds(left, meta, {})
    assert not rewrites.holds(left, meta, {LOG: "garbage"})
    assert not rewrites.holds(left, {k: v for k, v in meta.items() if k != "round"}, noted)
