"""The source and artifact tools against every store: only declared sources are read, a
snapshot is read once and served the same bytes after, evidence must quote its snapshot,
citations must be current, and a changed fingerprint invalidates what depended on it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from tether import errors
from tether.runtime.tasks import create_task
from tether.spec import parse_spec
from tether.store.base import Store
from tether.tools.builtin import sources as source_tools_module
from tether.tools.builtin.sources import source_tools
from tether.tools.registry import Tool, ToolContext


class Calls:
    """Calls the tools as the runtime would, one op id per call."""

    def __init__(self, store: Store, task_id: str, token: int, ws: Path) -> None:
        self.store, self.task_id, self.token, self.ws = store, task_id, token, ws
        self.tools: dict[str, Tool] = {t.name: t for t in source_tools(lambda: store)}
        self.n = 0

    async def __call__(self, name: str, token: int | None = None, **args: Any) -> str:
        self.n += 1
        ctx = ToolContext(
            op_id=f"{self.task_id}.r{self.n}.c0",
            task_id=self.task_id,
            task_version=1,
            fencing_token=self.token if token is None else token,
            workspace=self.ws,
            logger=logging.getLogger("test"),
        )
        return str(await self.tools[name].fn(args, ctx))


@pytest.fixture
async def call(store: Store, tmp_path: Path) -> Calls:
    (tmp_path / "b.md").write_text("# B 2.0\nB costs 35 euros.\n")
    (tmp_path / "c.csv").write_text("x,y\n1,2\n")
    spec = parse_spec(
        {
            "objective": "o",
            "items": [{"id": "i", "title": "t"}],
            "sources": [
                {"id": "B", "version": "2.0", "location": "b.md"},
                {
                    "id": "C",
                    "kind": "dataset",
                    "version": "7",
                    "location": "c.csv",
                    "pin": "fingerprint",
                },
                {"id": "U", "kind": "url", "version": "1", "location": "http://127.0.0.1:9/x"},
            ],
        }
    )
    task = await create_task(store, spec, workspace=tmp_path)
    lease = await store.claim("w", 60, task_id=task.task_id)
    assert lease is not None
    return Calls(store, task.task_id, lease.token, tmp_path)


def _id(text: str, what: str) -> str:
    return text.split(what, 1)[1].split()[0]


async def test_only_declared_sources_are_read(call: Calls) -> None:
    with pytest.raises(errors.ToolFailed, match="not a source of this task"):
        await call("read_source", source="secrets")
    # A url source is fetched (nothing listens on port 9 here).
    with pytest.raises(errors.ToolFailed, match="cannot fetch source U"):
        await call("read_source", source="U")


async def test_a_snapshot_serves_the_same_bytes_after_the_file_changed(call: Calls) -> None:
    first = await call("read_source", source="B")
    assert "B costs 35 euros." in first and "version 2.0" in first
    (call.ws / "b.md").write_text("# B 2.0\nB costs 99 euros.\n")
    again = await call("read_source", source="B")
    assert "B costs 35 euros." in again and "99 euros" not in again
    snap = _id(first, "cite snapshot artifact ")
    assert _id(again, "cite snapshot artifact ") == snap
    arts = await call.store.get_artifacts(call.task_id)
    assert [(a.kind, a.deps) for a in arts] == [("source_snapshot", ("source:B@2.0",))]


async def test_evidence_quotes_its_snapshot_and_claims_cite_current_evidence(
    call: Calls,
) -> None:
    snap = _id(await call("read_source", source="B"), "cite snapshot artifact ")
    with pytest.raises(errors.ToolFailed, match="not in"):
        await call("record_evidence", source_artifact=snap, excerpt="B is free")
    with pytest.raises(errors.ToolFailed, match="not a valid source_snapshot"):
        await call("record_evidence", source_artifact="nope", excerpt="B")
    ev = _id(
        await call("record_evidence", source_artifact=snap, excerpt="B  costs 35\neuros."),
        "evidence artifact ",
    )
    with pytest.raises(errors.ToolFailed, match="not a valid evidence"):
        await call("record_claim", text="B is cheap", evidence=[ev, snap])
    claim = _id(await call("record_claim", text="B is cheap", evidence=[ev]), "claim artifact ")
    with pytest.raises(errors.ToolFailed, match="not a valid claim"):
        await call("write_report_section", title="t", text="x", claims=[ev])
    await call("write_report_section", title="Prices", text="x", claims=[claim])
    deps = {a.kind: a.deps for a in await call.store.get_artifacts(call.task_id)}
    assert deps["evidence"] == (f"artifact:{snap}", "source:B@2.0")
    assert deps["claim"] == (f"artifact:{ev}",)
    assert deps["report_section"] == (f"artifact:{claim}",)


async def test_a_changed_fingerprint_invalidates_its_dependents(call: Calls) -> None:
    first = await call("read_source", source="C")
    fp = _id(first, "cite snapshot artifact ")
    assert "1,2" in first
    # A fingerprint pin keeps no content; evidence of it is trusted as quoted.
    ev = _id(await call("record_evidence", source_artifact=fp, excerpt="1,2"), "evidence artifact ")
    claim = _id(await call("record_claim", text="y is 2", evidence=[ev]), "claim artifact ")
    assert "NOTE" not in await call("read_source", source="C")  # unchanged: nothing happens
    (call.ws / "c.csv").write_text("x,y\n1,3\n")
    changed = await call("read_source", source="C")
    assert "changed on re-read" in changed and "1,3" in changed
    arts = {a.artifact_id: a for a in await call.store.get_artifacts(call.task_id)}
    assert {i for i, a in arts.items() if not a.valid} == {fp, ev, claim}
    assert arts[_id(changed, "cite snapshot artifact ")].valid
    events = await call.store.read_events(call.task_id, types={"artifacts.invalidated"})
    assert set(events[0].data["artifacts"]) == {fp, ev, claim}


async def test_a_worker_without_the_lease_writes_nothing(call: Calls) -> None:
    with pytest.raises(errors.StaleLease):
        await call("read_source", token=call.token + 5, source="B")
    assert await call.store.get_artifacts(call.task_id) == []


async def test_a_source_too_large_to_snapshot_is_refused(
    call: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(source_tools_module, "MAX_SNAPSHOT_BYTES", 8)
    with pytest.raises(errors.ToolFailed, match="pin it by fingerprint"):
        await call("read_source", source="B")
    assert await call.store.get_artifacts(call.task_id) == []
