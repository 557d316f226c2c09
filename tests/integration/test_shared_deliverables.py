"""One file shared by several items, each accepted by its own `done_when` rule.

A changelog with a section per release, a report with a part per chapter: honest work
grows or rewrites the shared file after earlier items were accepted on it. Growth (the
accepted content still the file's beginning) and the task's own rewrite that keeps
each item's text leave the earlier items done, so the task is delivered in its planned
rounds with no `deliverable_broken`. A rewrite that drops an accepted item's text, and
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
from tether.runtime.recovery.deliverables import _Check
from tether.spec import TaskSpec, parse_spec
from tether.store.base import OpRecord, Store

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
