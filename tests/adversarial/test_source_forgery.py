"""A model that forges its sources: it quotes what a source does not say, overwrites a
declared source (or its snapshot) with its own text before reading it, and cites with
ids that are not what they look like. Every store: nothing it forges becomes evidence."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest

from tether import errors
from tether.runtime.tasks import create_task
from tether.spec import parse_spec
from tether.store.base import ArtifactRecord, Store, blob_hash
from tether.tools.builtin.files import default_registry
from tether.tools.registry import ToolContext


class Calls:
    """Calls the built-in tools as the runtime would, one op id per call."""

    def __init__(self, store: Store, task_id: str, token: int, ws: Path) -> None:
        self.store, self.task_id, self.token, self.ws = store, task_id, token, ws
        self.reg = default_registry(lambda: store)
        self.n = 0

    async def __call__(self, name: str, **args: Any) -> str:
        self.n += 1
        ctx = ToolContext(
            op_id=f"{self.task_id}.r{self.n}.c0",
            task_id=self.task_id,
            task_version=1,
            fencing_token=self.token,
            workspace=self.ws,
            logger=logging.getLogger("test"),
        )
        tool = self.reg.get(name)
        assert tool is not None
        return str(await tool.fn(tool.check_args(args), ctx))  # checked as the runtime does


@pytest.fixture
async def call(store: Store, tmp_path: Path) -> Calls:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# B 2.0\nB costs 35 euros.\n")
    (tmp_path / "c.csv").write_text("x,y\n1,2\n")
    spec = parse_spec(
        {
            "objective": "o",
            "items": [{"id": "i", "title": "t"}],
            "sources": [
                {"id": "B", "version": "2.0", "location": "docs/b.md"},
                {
                    "id": "C",
                    "kind": "dataset",
                    "version": "7",
                    "location": "c.csv",
                    "pin": "fingerprint",
                },
            ],
        }
    )
    task = await create_task(store, spec, workspace=tmp_path)
    lease = await store.claim("w", 60, task_id=task.task_id)
    assert lease is not None
    return Calls(store, task.task_id, lease.token, tmp_path)


def _id(text: str, what: str) -> str:
    return text.split(what, 1)[1].split()[0]


async def _refused(call: Calls, name: str, match: str, **args: Any) -> None:
    before = await call.store.get_artifacts(call.task_id)
    with pytest.raises(errors.ToolFailed, match=match):
        await call(name, **args)
    assert await call.store.get_artifacts(call.task_id) == before, "a refused call stored"


async def test_evidence_must_quote_the_read_whatever_its_pin(call: Calls) -> None:
    fp = _id(await call("read_source", source="C"), "cite snapshot artifact ")
    snap = _id(await call("read_source", source="B"), "cite snapshot artifact ")
    # Invented, blank, and cut out of a longer number: none quotes the source. A read
    # pinned by fingerprint stores no bytes, but the excerpt is checked all the same.
    for art, excerpt in (
        (fp, "x,y\n1,2,3"),
        (fp, "the sky is green"),
        (fp, " \n\t"),
        (snap, " \n"),
        (snap, "costs 3"),
        (snap, "B costs 35 euros. And is free"),
    ):
        await _refused(call, "record_evidence", "not in", source_artifact=art, excerpt=excerpt)
    await call("record_evidence", source_artifact=snap, excerpt="B costs 35")
    await call("record_evidence", source_artifact=fp, excerpt="1,2")
    # The dataset changed behind the fingerprint: the old read is no ground to quote from
    # (not even the new text), until the source is read again.
    (call.ws / "c.csv").write_text("x,y\n1,2\n3,4\n")
    await _refused(call, "record_evidence", "changed since", source_artifact=fp, excerpt="3,4")
    again = _id(await call("read_source", source="C"), "cite snapshot artifact ")
    assert again != fp
    # The old read is still readable, as history: never as current.
    assert "INVALID, history only" in await call("read_artifact", artifact_id=fp)
    assert "INVALID" not in await call("read_artifact", artifact_id=again)
    await call("record_evidence", source_artifact=again, excerpt="3,4")


@pytest.mark.parametrize("tool", ["write_file", "append_file"])
async def test_a_declared_source_is_never_written_by_any_name(call: Calls, tool: str) -> None:
    (call.ws / "hard.md").hardlink_to(call.ws / "docs" / "b.md")
    names = ["docs/b.md", "./docs/b.md", "docs//b.md", "docs/../docs/b.md", "hard.md", "c.csv"]
    names.append(str(call.ws / "docs" / "b.md"))
    for path in names:
        with pytest.raises(errors.ToolFailed, match="never written"):
            await call(tool, path=path, content="B is free.\n")
    assert (call.ws / "docs" / "b.md").read_text() == "# B 2.0\nB costs 35 euros.\n"
    assert (call.ws / "c.csv").read_text() == "x,y\n1,2\n"
    # Nor a source whose file is missing: the model may not create what it will quote.
    (call.ws / "docs" / "b.md").unlink()
    (call.ws / "hard.md").unlink()
    with pytest.raises(errors.ToolFailed, match="never written"):
        await call(tool, path="docs/b.md", content="B is free.\n")
    assert not (call.ws / "docs" / "b.md").exists()
    # Any other file is written as before, a case variant of a source's name included
    # (another file on a case-sensitive file system).
    assert "docs/B.md" in await call(tool, path="docs/B.md", content="notes\n")


async def test_a_report_is_not_written_over_a_source(call: Calls) -> None:
    snap = _id(await call("read_source", source="B"), "cite snapshot artifact ")
    ev = _id(
        await call("record_evidence", source_artifact=snap, excerpt="B costs 35 euros."),
        "evidence artifact ",
    )
    claim = _id(await call("record_claim", text="B costs 35", evidence=[ev]), "claim artifact ")
    sec = _id(
        await call("write_report_section", title="Price", text="35", claims=[claim]),
        "report section artifact ",
    )
    await _refused(
        call, "write_report", "never written", path="docs/b.md", title="t", sections=[sec]
    )
    assert (call.ws / "docs" / "b.md").read_text() == "# B 2.0\nB costs 35 euros.\n"
    assert "report artifact" in await call(
        "write_report", path="report.md", title="t", sections=[sec]
    )


async def test_odd_citation_ids_are_unknown_never_a_store_failure(call: Calls) -> None:
    """Ids a model makes up (prefixed, traversing, huge, with NUL or SQL/FTS syntax)
    are unknown artifacts: a clear tool failure, on PostgreSQL too (whose text cannot
    hold a NUL: the query must not fail as if the store were down)."""
    odd = ["artifact:", "op:../x", "x" * 5000, "\u00e9\x00", "' OR 1=1 --", '"a" OR b*', ""]
    for ident in odd:
        await _refused(call, "record_claim", "not a valid evidence", text="t", evidence=[ident])
        await _refused(
            call, "write_report_section", "not a valid claim", title="t", text="t", claims=[ident]
        )
        await _refused(
            call,
            "write_report",
            "not a valid report_section",
            path="r.md",
            title="t",
            sections=[ident],
        )
        await _refused(
            call,
            "record_evidence",
            "not a valid source_snapshot",
            source_artifact=ident,
            excerpt="B",
        )
        with pytest.raises(errors.ToolFailed, match="no artifact"):
            await call("read_artifact", artifact_id=ident)
    # Arguments past their bounds are refused before anything runs.
    for name, args in (
        ("record_evidence", {"source_artifact": "x", "excerpt": "B", "location": "l" * 501}),
        ("record_claim", {"text": "t", "evidence": ["x"], "topic": "t" * 201}),
        ("record_claim", {"text": "t", "evidence": ["x"] * 51}),
        ("write_report", {"path": "p" * 1001, "title": "t", "sections": ["x"]}),
        (
            "write_report",
            {"path": "r.md", "title": "t", "sections": ["x"], "open_questions": ["q" * 2001]},
        ),
        ("write_report", {"path": "r.md", "title": "t", "sections": []}),
        ("read_source", {"source": "B", "limit": 10**9}),
        ("read_source", {"source": "B", "offset": -1}),
        ("record_claim", {"text": 5, "evidence": "x"}),
        # A source's location is the contract's: no argument can point it elsewhere.
        ("read_source", {"source": "B", "location": "http://127.0.0.1:9/x"}),
        ("read_source", {"source": "B", "url": "http://127.0.0.1:9/x"}),
    ):
        await _refused(call, name, "bad arguments", **args)
    for query in ('"', "a OR b*", "NEAR(a b)", "')--", "\x00", "-x", "col:x", "^", "*"):
        assert isinstance(await call("search_artifacts", query=query), str)
        assert "no stored artifact" in await call("search_artifacts", query="B", kinds=[query])


async def test_a_section_cannot_cite_in_its_text_what_it_does_not_cite(call: Calls) -> None:
    """The report cites claims in brackets: a section whose text (or title) brackets an
    id it does not cite, a made-up one or another task's, would read as a citation that
    nothing backs. A title cannot open headings of its own either."""
    snap = _id(await call("read_source", source="B"), "cite snapshot artifact ")
    ev = _id(
        await call("record_evidence", source_artifact=snap, excerpt="B costs 35 euros."),
        "evidence artifact ",
    )
    claim = _id(await call("record_claim", text="B costs 35", evidence=[ev]), "claim artifact ")
    for title, text in (
        ("Price", "B is free [t6b0e00000000aa.r9.c0.claim]."),
        ("Price", f"B costs 35 [{claim}], and B is free [{ev}]."),
        ("Price [t6b0e00000000aa.r1.c0.claim]", "B costs 35."),
    ):
        await _refused(
            call,
            "write_report_section",
            "not among the claims",
            title=title,
            text=text,
            claims=[claim],
        )
    sec = _id(
        await call(
            "write_report_section",
            title="Price\n\n## Open questions\n\n- none",
            text=f"B costs 35 euros [{claim}] (see [1]).\n## Open questions\n\n- none\n"
            "Open questions\n---\n# Done\n### Detail",
            claims=[claim],
        ),
        "report section artifact ",
    )
    await call("write_report", path="report.md", title="R\n# Fake", sections=[sec])
    report = (call.ws / "report.md").read_text()
    top = [line for line in report.splitlines() if re.match(r" {0,3}#{1,2} |[=-]+$", line)]
    assert top == ["# R # Fake", "## Price ## Open questions - none", "## Open questions"]
    assert "### Detail" in report
    cited = set(re.findall(r"\[(t[0-9a-f]+\.[^\]\s]+)\]", report))
    assert cited == {claim}


async def test_another_tasks_artifacts_are_unknown_here(call: Calls, tmp_path: Path) -> None:
    """The same store holds another task reading the same file: its snapshot, evidence,
    claim and section are not this task's to quote or cite (nor to read)."""
    other_ws = tmp_path / "other"
    other_ws.mkdir()
    (other_ws / "b.md").write_text("# B 2.0\nB costs 35 euros.\n")
    spec = parse_spec(
        {
            "objective": "o",
            "items": [{"id": "i", "title": "t"}],
            "sources": [{"id": "B", "version": "2.0", "location": "b.md"}],
        }
    )
    task = await create_task(call.store, spec, workspace=other_ws)
    lease = await call.store.claim("w2", 60, task_id=task.task_id)
    assert lease is not None
    other = Calls(call.store, task.task_id, lease.token, other_ws)
    snap = _id(await other("read_source", source="B"), "cite snapshot artifact ")
    ev = _id(
        await other("record_evidence", source_artifact=snap, excerpt="B costs"),
        "evidence artifact ",
    )
    claim = _id(await other("record_claim", text="B costs", evidence=[ev]), "claim artifact ")
    sec = _id(
        await other("write_report_section", title="P", text="x", claims=[claim]),
        "report section artifact ",
    )
    await _refused(call, "record_evidence", "not a valid", source_artifact=snap, excerpt="B costs")
    await _refused(call, "record_claim", "not a valid", text="B costs", evidence=[ev])
    await _refused(call, "write_report_section", "not a valid", title="P", text="x", claims=[claim])
    await _refused(call, "write_report", "not a valid", path="r.md", title="t", sections=[sec])
    with pytest.raises(errors.ToolFailed, match="no artifact"):
        await call("read_artifact", artifact_id=ev)
    assert "no stored artifact" in await call("search_artifacts", query="B costs")
    assert not (call.ws / "r.md").exists()


async def test_a_claim_rests_on_quotes_not_on_the_rule_judges_evidence(call: Calls) -> None:
    """The rule judge's evidence (a file that exists) is evidence of an item: a claim
    citing it would look sourced in the report while quoting nothing."""
    data = b"out/a.txt exists"
    rule_ev = ArtifactRecord(
        artifact_id=f"{call.task_id}.ev1",
        task_id=call.task_id,
        kind="evidence",
        name="i",
        blob_hash=blob_hash(data),
        size=len(data),
        source="rule judge",
        task_version=1,
        meta={"deliverable": "out/a.txt", "sha256": "0" * 64},
    )
    await call.store.commit(call.task_id, call.token, [], artifacts=[rule_ev], blobs=[data])
    await _refused(
        call, "record_claim", "quote no source", text="B is free", evidence=[rule_ev.artifact_id]
    )
    # Nor does a valid quote launder it.
    snap = _id(await call("read_source", source="B"), "cite snapshot artifact ")
    ev = _id(
        await call("record_evidence", source_artifact=snap, excerpt="B costs"), "evidence artifact "
    )
    await _refused(
        call, "record_claim", "quote no source", text="B", evidence=[ev, rule_ev.artifact_id]
    )
    assert "claim artifact" in await call("record_claim", text="B costs", evidence=[ev])
