"""Sources, artifacts that depend on them, and exact invalidation, on every store.

A comparison task reads product A 1.0 and B 2.0 from a local corpus (two corpora, so the
test does not hinge on one set of documents), records evidence quoted from snapshots,
claims citing the evidence and a report section citing the claims. Editing the task to
B 3.0 invalidates exactly B's snapshot, evidence and claim and the section; A's stay
current and A is not read again; the redone task cites B 3.0."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support.loop import events_of, ledger_of, run_task
from tether import artifacts as A
from tether.edits import edit_task
from tether.models.base import ModelRequest, ModelResponse
from tether.models.scripted import ScriptedModel, tool_call
from tether.rebuild import rebuild
from tether.spec import parse_spec
from tether.store.base import Store

DATA = Path(__file__).resolve().parents[1] / "data"
IDS = re.compile(r"(cite snapshot artifact|evidence artifact|claim artifact) (\S+)")


def _spec() -> Any:
    return parse_spec(
        {
            "name": "compare",
            "objective": "compare products A and B from the corpus, every claim cited",
            "sources": [
                {"id": "A", "version": "1.0", "location": "corpus/a-1.0.md"},
                {"id": "B", "version": "2.0", "location": "corpus/b-2.0.md"},
            ],
            "items": [
                {
                    "id": "claim_a",
                    "title": "a cited claim about A",
                    "done_when": {"kind": "artifact", "artifact_kind": "claim", "name": "A"},
                },
                {
                    "id": "claim_b",
                    "title": "a cited claim about B",
                    "done_when": {"kind": "artifact", "artifact_kind": "claim", "name": "B"},
                },
                {
                    "id": "section",
                    "title": "the comparison section",
                    "after": ["claim_a", "claim_b"],
                    "done_when": {"kind": "artifact", "artifact_kind": "report_section"},
                },
            ],
            "tools": ["read_source", "record_evidence", "record_claim", "write_report_section"],
        }
    )


class Analyst:
    """A scripted model: reads the Next item's source, quotes its first fact, claims it,
    and writes the section from the current claims. It remembers ids across runs, like
    a model reading its context; `forget(product)` is the ledger telling it to redo."""

    def __init__(self, workspace: Path) -> None:
        self.ws = workspace
        self.ids: dict[str, dict[str, str]] = {"A": {}, "B": {}}
        self.reads: list[str] = []
        self.asked: str | None = None  # the product of the last call made
        self.versions = {"A": "1.0", "B": "2.0"}

    def forget(self, product: str) -> None:
        self.ids[product] = {}

    def _learn(self, request: ModelRequest) -> None:
        product = self.asked
        last = [m for m in request.messages if m.role == "tool"][-1:]
        for m in last:
            for what, ident in IDS.findall(m.content):
                key = {"cite snapshot artifact": "snap", "evidence artifact": "ev"}.get(
                    what, "claim"
                )
                if product is not None:
                    self.ids[product][key] = ident

    def __call__(self, request: ModelRequest) -> ModelResponse:
        nxt = request.ledger["next"] if request.ledger else None
        product = {"claim_a": "A", "claim_b": "B"}.get(nxt or "")
        self._learn(request)
        self.asked = product
        if nxt is None:
            return ModelResponse("the comparison is written")
        if product is None:
            claims = [self.ids[p]["claim"] for p in ("A", "B")]
            call = tool_call(
                "write_report_section", title="Comparison", text="A vs B", claims=claims
            )
            return ModelResponse("section", (call,))
        mine = self.ids[product]
        if "claim" in mine:
            # Asked for the claim again: what it rested on broke. The snapshot still
            # serves; quote it again.
            mine.pop("ev")
            mine.pop("claim")
        if "snap" not in mine:
            self.reads.append(product)
            return ModelResponse("read", (tool_call("read_source", source=product),))
        if "ev" not in mine:
            spec_loc = self.ws / "corpus" / f"{product.lower()}-{self.version(product)}.md"
            fact = spec_loc.read_text().splitlines()[1]
            return ModelResponse(
                "quote",
                (tool_call("record_evidence", source_artifact=mine["snap"], excerpt=fact),),
            )
        return ModelResponse(
            "claim",
            (
                tool_call(
                    "record_claim", text=f"about {product}", evidence=[mine["ev"]], topic=product
                ),
            ),
        )

    def version(self, product: str) -> str:
        return self.versions[product]


@pytest.mark.parametrize("corpus", ["corpus_ab", "corpus_tea"])
async def test_a_new_source_version_invalidates_exactly_what_depended_on_it(
    store: Store, tmp_path: Path, corpus: str
) -> None:
    shutil.copytree(DATA / corpus, tmp_path / "corpus")
    analyst = Analyst(tmp_path)
    analyst.versions = {"A": "1.0", "B": "2.0"}
    tid, first = await run_task(store, _spec(), tmp_path, ScriptedModel(policy=analyst))
    assert first.status == "satisfied", first
    before = {a.artifact_id: a for a in await store.get_artifacts(tid)}
    kinds = sorted(a.kind for a in before.values())
    assert kinds == sorted(
        ["source_snapshot"] * 2 + ["evidence"] * 2 + ["claim"] * 2 + ["report_section"]
    )
    b_chain = {analyst.ids["B"][k] for k in ("snap", "ev", "claim")}
    a_chain = {analyst.ids["A"][k] for k in ("snap", "ev", "claim")}
    section = next(a.artifact_id for a in before.values() if a.kind == "report_section")

    task = await store.get_task(tid)
    await edit_task(
        store,
        tid,
        A.source_changes(task.spec, ["B=3.0@corpus/b-3.0.md"]),
        reason="B 3.0 is out",
    )
    after = {a.artifact_id: a for a in await store.get_artifacts(tid)}
    invalid = {i for i, a in after.items() if not a.valid}
    assert invalid == b_chain | {section}
    assert all(after[i].valid for i in a_chain)
    assert "changed from version 2.0 to 3.0" in after[section].meta[A.INVALIDATED]["reason"]
    led = await ledger_of(store, tid)
    assert [led.item(i).status for i in ("claim_a", "claim_b", "section")] == [
        "done",
        "pending",
        "pending",
    ]
    assert "invalid" in led.item("claim_b").note
    inval = await events_of(store, tid, "artifacts.invalidated")
    assert set(inval[0]["items"]) == {"claim_b", "section"}

    analyst.forget("B")
    analyst.versions["B"] = "3.0"
    analyst.reads.clear()
    _, second = await run_task(store, _spec(), tmp_path, ScriptedModel(policy=analyst), task_id=tid)
    assert second.status == "satisfied", second
    assert analyst.reads == ["B"]  # A was kept and not read again
    final = await store.get_artifacts(tid)
    current = [a for a in final if a.valid]
    new_snap = next(a for a in current if a.kind == "source_snapshot" and a.name == "B")
    assert new_snap.meta["version"] == "3.0"
    assert "3.0" in (await store.get_blob(new_snap.blob_hash)).decode()
    new_section = next(a for a in current if a.kind == "report_section")
    cited = {d.partition(":")[2] for d in new_section.deps}
    assert analyst.ids["A"]["claim"] in cited and not cited & invalid
    # History: the stale artifacts are still stored, never current.
    assert {a.artifact_id for a in final if not a.valid} == invalid
    # The invalidation is journaled in full: the log folds back to the stored ledger.
    assert (await rebuild(store, tid))["ledger"] == []


async def test_a_report_never_ships_with_a_dangling_citation(
    sql_backend: Any, tmp_path: Path
) -> None:
    shutil.copytree(DATA / "corpus_ab", tmp_path / "corpus")
    store = await sql_backend.open()
    analyst = Analyst(tmp_path)
    lost: list[str] = []

    def policy(request: ModelRequest) -> ModelResponse:
        response = analyst(request)
        if (
            response.tool_calls
            and response.tool_calls[0].name == "write_report_section"
            and not lost
        ):
            # A's evidence vanishes from storage just before the section cites its claim.
            lost.append(analyst.ids["A"]["ev"])
            conn = sql_backend.raw()
            try:
                cur = conn.cursor()
                param = "?" if sql_backend.kind == "sqlite" else "%s"
                cur.execute(
                    f"SELECT blob_hash FROM artifacts WHERE artifact_id = {param}", (lost[0],)
                )
                blob = cur.fetchone()["blob_hash"]
                cur.execute(f"DELETE FROM blobs WHERE hash = {param}", (blob,))
                conn.commit()
            finally:
                conn.close()
        return response

    try:
        tid, result = await run_task(store, _spec(), tmp_path, ScriptedModel(policy=policy))
        assert lost and result.status == "satisfied", result
        warnings = [
            w["details"]
            for w in await events_of(store, tid, "audit.warning")
            if w["code"] == "deliverable_broken"
        ]
        assert {w["item"] for w in warnings} == {"claim_a", "section"}
        assert all(lost[0] in w["reason"] for w in warnings)
        invalid = {a.artifact_id for a in await store.get_artifacts(tid) if not a.valid}
        first_claim = next(iter(await events_of(store, tid, "artifacts.invalidated")))
        assert lost[0] in invalid and set(first_claim["artifacts"]) == invalid
        # The delivered section cites only current claims whose evidence is stored.
        current = {a.artifact_id: a for a in await store.get_artifacts(tid) if a.valid}
        section = next(a for a in current.values() if a.kind == "report_section")
        for dep in section.deps:
            claim = current[dep.partition(":")[2]]
            for ev_dep in claim.deps:
                ev_art = current[ev_dep.partition(":")[2]]
                assert await store.get_blob(ev_art.blob_hash)
        # A's source was not read from disk again: its snapshot served the new quote.
        assert analyst.reads == ["A", "B"]
    finally:
        await store.close()
