"""The acceptance scenario end to end: a research task compares products A and B from a
local corpus of versioned documents, through the CLI, with real worker processes, a real
HTTP ticket service, fail points, and a scripted analyst that reacts to what it sees
(`tests/e2e/ab_policies.py`). On SQLite and on PostgreSQL, over two different corpora.

1. The worker is killed right after it read the second document (fail point, real
   process death). The document is then changed on disk; after resume the snapshot
   serves the bytes first read, no read is lost or repeated, and the contract (sources,
   dimensions, budget) and every citation still hold.
2. The run ends waiting for a human to approve the ticket. One evidence artifact is
   deleted from storage and the report file from the workspace: the next recovery finds
   both broken citations; the analyst re-quotes from the stored snapshot (no re-read) and
   rewrites the report; the report never ships with a dangling citation.
3. The approved ticket is sent; the ticket service executes it and drops the response,
   and the worker dies right there. After recovery the service holds exactly one ticket.
4. `tether edit TASK --source B=3.0`: B's snapshot, evidence, claims, the sections and
   the report are invalidated and redone from B 3.0; A's are kept and A is not re-read.
5. Each delivery is `satisfied / delivered` only after the acceptance check passed, and
   the report lists its open questions; `tether status` shows the sources with their
   versions and the invalid artifacts.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.blobs import delete_blob
from tests.support.cli import cli_env, describe, tether
from tests.support.services import TicketAPI

from .ab_policies import REPORT, cited_claims

# A dozen CLI processes per run: generous for a loaded CI machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

DATA = Path(__file__).resolve().parents[1] / "data"
MODEL = "scripted:tests.e2e.ab_policies:analyst"

#: Per corpus: the required dimensions (name, the word the documents use), those every
#: version documents (the acceptance check wants a section for each), and what each
#: version leaves open.
CORPORA: dict[str, dict[str, Any]] = {
    "corpus_ab": {
        "dims": [("price", "costs"), ("sso", "sign-on"), ("uptime", "uptime"),
                 ("residency", "stored in")],
        "always": ["price", "sso", "uptime"],
        "open_before": ["A 1.0: residency is not documented", "B 2.0: residency is not documented"],
        "open_after": ["A 1.0: residency is not documented"],
    },
    "corpus_tea": {
        "dims": [("speed", "boils"), ("body", "body"), ("price", "costs"),
                 ("warranty", "warranty")],
        "always": ["speed", "body", "price"],
        "open_before": ["A 1.0: warranty is not documented", "B 2.0: warranty is not documented"],
        "open_after": ["A 1.0: warranty is not documented"],
    },
}  # fmt: skip


def spec(corpus: str) -> dict[str, Any]:
    """The comparison contract: allowed sources at their versions, required dimensions,
    claims that must cite evidence, a report, a ticket for the open questions (a human
    approves it), a budget, and the report's acceptance check."""
    dims = "; ".join(f"{name} ({word})" for name, word in CORPORA[corpus]["dims"])
    return {
        "name": "ab-comparison",
        "objective": "Compare product A and product B from the declared sources only; "
        "every claim cites evidence; the report lists its open questions",
        "instructions": f"Required dimensions: {dims}\n"
        "Quote evidence from the sources' snapshots; a dimension no source documents is "
        "an open question, filed as one ticket.",
        "sources": [
            {"id": "A", "version": "1.0", "location": "corpus/a-1.0.md", "title": "A"},
            {"id": "B", "version": "2.0", "location": "corpus/b-2.0.md", "title": "B"},
        ],
        "items": [
            {"id": "claims_a", "title": "cited claims about A",
             "done_when": {"kind": "artifact", "artifact_kind": "claim", "name": "A",
                           "min_count": 3}},
            {"id": "claims_b", "title": "cited claims about B",
             "done_when": {"kind": "artifact", "artifact_kind": "claim", "name": "B",
                           "min_count": 3}},
            {"id": "sections", "title": "a section per dimension",
             "after": ["claims_a", "claims_b"],
             "done_when": {"kind": "artifact", "artifact_kind": "report_section",
                           "min_count": 3}},
            {"id": "report", "title": f"the report ({REPORT})", "after": ["sections"],
             "done_when": {"kind": "artifact", "artifact_kind": "report"}},
            {"id": "ticket", "title": "one ticket with the open questions", "after": ["report"],
             "done_when": {"kind": "op", "tool": "create_ticket"}},
        ],
        "acceptance": [
            {"id": "report_complete", "description": "the report covers the dimensions, "
             "cites claims and lists open questions",
             "check": {"callable": "tests.e2e.ab_policies:report_is_complete"}},
        ],
        "tools": ["read_source", "record_evidence", "record_claim", "write_report_section",
                  "write_report", {"name": "create_ticket", "approval": True}],
        "budget": {"tokens": 2_000_000, "rounds": 80},
        "limits": {"max_rounds": 80},
        "models": {"judge": "rules"},
        "context": {"input_budget_tokens": 200_000},
    }  # fmt: skip


# ---------------------------------------------------------------- plumbing


class Scenario:
    """One database, one workspace, one ticket service; the CLI in subprocesses."""

    def __init__(self, db: str, root: Path, corpus: str, api: TicketAPI) -> None:
        self.db = db
        self.root = root
        self.api = api
        self.ws = root / "ws"
        self.ws.mkdir()
        shutil.copytree(DATA / corpus, self.ws / "corpus")
        (self.ws / "dimensions.txt").write_text(" ".join(CORPORA[corpus]["always"]) + "\n")
        self.spec = root / "spec.yaml"
        self.spec.write_text(yaml.safe_dump(spec(corpus), sort_keys=False))
        self.task = ""

    def env(self, failpoints: str | None = None) -> dict[str, str]:
        return cli_env(
            TETHER_TOOLS="tests.services.tools:TOOLS",
            TICKETS_URL=self.api.url,
            TETHER_FAILPOINTS=failpoints,
        )

    def __call__(
        self, *args: str | Path, failpoints: str | None = None, code: int = 0
    ) -> subprocess.CompletedProcess[str]:
        res = tether(*args, "--db", self.db, cwd=self.root, env=self.env(failpoints), timeout=180)
        assert res.returncode == code, describe(res)
        return res

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "--json").stdout)

    def status(self) -> dict[str, Any]:
        return dict(self.json("status", self.task))

    def events(self) -> list[dict[str, Any]]:
        return list(self.json("events", self.task))

    def artifacts(self) -> list[dict[str, Any]]:
        return list(self.json("artifacts", self.task))

    def worker(self, failpoints: str | None = None, code: int = 0) -> str:
        res = self("worker", "--once", "--model", MODEL, failpoints=failpoints, code=code)
        return res.stderr

    def resume(self) -> dict[str, Any]:
        return dict(json.loads(self("resume", self.task, "--model", MODEL, "--json").stdout))


def of(evs: list[dict[str, Any]], type_: str) -> list[dict[str, Any]]:
    return [e["data"] for e in evs if e["type"] == type_]


def reads(evs: list[dict[str, Any]]) -> Counter[tuple[str, str]]:
    """How many times each source version was read from its location (a snapshot made)."""
    return Counter(
        (a["name"], a["artifact_id"]) for a in of(evs, "artifact.stored")
        if a["kind"] == "source_snapshot"
    )  # fmt: skip


def by_kind(arts: list[dict[str, Any]], kind: str, *, valid: bool = True) -> list[dict[str, Any]]:
    return [a for a in arts if a["kind"] == kind and a["valid"] is valid]


def snap_id(snaps: list[dict[str, Any]], source: str) -> str:
    return str(next(a["artifact_id"] for a in snaps if a["name"] == source))


def deps_of(art: dict[str, Any]) -> list[str]:
    return [d.partition(":")[2] for d in art["deps"] if d.startswith("artifact:")]


def assert_citations_hold(sc: Scenario) -> None:
    """Every current claim cites current evidence, every current section current claims,
    the current report current sections; the report file cites exactly the claims of
    its sections, all current (no dangling citation)."""
    arts = {a["artifact_id"]: a for a in sc.artifacts()}
    for kind, cites in (("claim", "evidence"), ("report_section", "claim"),
                        ("report", "report_section"), ("evidence", "source_snapshot")):  # fmt: skip
        for art in by_kind(list(arts.values()), kind):
            for dep in deps_of(art):
                assert arts[dep]["valid"] and arts[dep]["kind"] == cites, (art, arts[dep])
    report = by_kind(list(arts.values()), "report")
    assert len(report) == 1, report
    text = (sc.ws / REPORT).read_text()
    claims = cited_claims(text)
    assert claims and all(arts[c]["valid"] for c in claims), text
    section_claims = {c for s in deps_of(report[0]) for c in deps_of(arts[s])}
    assert set(claims) == section_claims


def assert_delivered(sc: Scenario, open_questions: list[str]) -> dict[str, Any]:
    doc = sc.status()
    assert (doc["status"], doc["stop_reason"]) == ("satisfied", "delivered"), doc
    assert all(i["status"] == "done" for i in doc["ledger"]["items"]), doc["ledger"]
    evs = sc.events()
    # Delivered only after the acceptance check passed: the last check before the
    # `satisfied` status passed, and ran the report's check.
    statuses = [(n, e) for n, e in enumerate(evs) if e["type"] == "task.status"]
    last = max(n for n, e in statuses if e["data"]["dst"] == "satisfied")
    check = [e["data"] for e in evs[:last] if e["type"] == "completion.checked"][-1]
    assert check["passed"] and [r["id"] for r in check["results"]] == ["report_complete"]
    assert all(r["passed"] for r in check["results"])
    text = (sc.ws / REPORT).read_text()
    listed = text.partition("## Open questions")[2]
    assert [ln[2:] for ln in listed.split("\n") if ln.startswith("- ")] == open_questions
    assert_citations_hold(sc)
    return doc


# ---------------------------------------------------------------- the scenario


@pytest.fixture
def api() -> Iterator[TicketAPI]:
    with TicketAPI() as service:
        yield service


@pytest.mark.parametrize("corpus", list(CORPORA))
def test_ab_comparison(corpus: str, db_url: str, tmp_path: Path, api: TicketAPI) -> None:
    db = db_url
    info = CORPORA[corpus]
    sc = Scenario(db, tmp_path, corpus, api)
    sc.task = str(sc.json("submit", str(sc.spec), "--workspace", str(sc.ws))["task_id"])
    b_text = (sc.ws / "corpus" / "b-2.0.md").read_text()

    # 1. Killed right after reading the second document (round 2: read A, then B).
    err = sc.worker("after_op_result=2", code=137)
    assert "fail point after_op_result reached" in err
    evs = sc.events()
    snaps = by_kind(sc.artifacts(), "source_snapshot")
    assert sorted(a["name"] for a in snaps) == ["A", "B"]  # B's read is stored already
    # The document changes on disk after the read: the stored snapshot must serve.
    (sc.ws / "corpus" / "b-2.0.md").write_text(b_text.replace("costs", "TAMPERED costs"))

    waiting = sc.resume()
    assert waiting["status"] == "waiting" and waiting["waiting"]["kind"] == "approval", waiting
    evs = sc.events()
    assert sorted(reads(evs)) == sorted((a["name"], a["artifact_id"]) for a in snaps)
    assert all(n == 1 for n in reads(evs).values())  # each source read once, none lost
    arts = sc.artifacts()
    # Every quote of B comes from the bytes first read (the snapshot), never the
    # changed file: each is a line of the original document.
    quoted = [
        d["args"] for d in of(evs, "op.intended") if d["tool"] == "record_evidence"
    ]  # fmt: skip
    b_quotes = [q["excerpt"] for q in quoted if q["source_artifact"] == snap_id(snaps, "B")]
    assert len(b_quotes) == 3 and all(q in b_text.splitlines() for q in b_quotes), b_quotes
    assert "TAMPERED" not in (sc.ws / REPORT).read_text()
    steps = [d["step"] for d in of(evs, "recovery.step")]
    assert steps[:6] == ["version", "artifacts", "ops", "deliverables", "ledger", "context"]
    # The contract still holds after the crash: the same sources, budget and checks.
    doc = sc.status()
    assert [(s["id"], s["version"]) for s in doc["sources"]] == [("A", "1.0"), ("B", "2.0")]
    assert {k: v for k, v in doc["budget"]["limits"].items() if v} == {
        "tokens": 2_000_000,
        "rounds": 80,
    }
    assert doc["budget"]["used"]["rounds"] <= 80
    assert_citations_hold(sc)
    assert len(by_kind(arts, "claim")) == 6 and len(by_kind(arts, "report_section")) == 3
    assert api.stats()["posts"] == []  # the ticket waits for a human

    # 2. Evidence deleted from storage, the report file from the workspace.
    a_claims = [a for a in by_kind(arts, "claim") if a["name"] == "A"]
    lost_claim = a_claims[0]
    lost_ev = deps_of(lost_claim)[0]
    delete_blob(db, lost_ev)
    (sc.ws / REPORT).unlink()
    request = waiting["waiting"]["request_id"]
    sc("approve", sc.task, request)

    # 3. The approved ticket: executed, its answer dropped, the worker dies right there.
    api.faults(drop_after=[1])
    err = sc.worker("after_op_dispatch=1", code=137)
    assert "fail point after_op_dispatch reached" in err
    assert api.stats()["created"] == 1
    evs = sc.events()
    found = [d["details"] for d in of(evs, "recovery.step") if d["step"] == "deliverables"][-1]
    broken = {b["item"]: b["reason"] for b in found["broken"]}
    assert lost_ev in broken["claims_a"] and "missing from the store" in broken["claims_a"]
    assert f"deliverable {REPORT} is missing" in broken["report"]
    assert {"claims_a", "sections", "report"} <= set(broken)
    assert "claims_b" not in broken

    doc = sc.resume()
    assert_delivered(sc, info["open_before"])
    evs = sc.events()
    ticket_op = next(d["op_id"] for d in of(evs, "op.intended") if d["tool"] == "create_ticket")
    assert [d["outcome"] for d in of(evs, "op.reconciled") if d["op_id"] == ticket_op] == ["done"]
    tickets = api.tickets()
    assert len(tickets) == 1 and api.stats()["created"] == 1
    assert tickets[0]["key"] == ticket_op and tickets[0]["title"].startswith("Open questions: ")
    assert Counter(p["key"] for p in api.stats()["posts"]) == {ticket_op: 1}
    arts = sc.artifacts()
    assert all(n == 1 for n in reads(evs).values()) and len(reads(evs)) == 2  # no re-read
    gone = {a["artifact_id"] for a in arts if not a["valid"]}
    assert {lost_ev, lost_claim["artifact_id"]} <= gone
    assert {a["artifact_id"] for a in a_claims[1:]} <= {
        a["artifact_id"] for a in by_kind(arts, "claim")
    }  # the other A claims were kept

    # 4. B 2.0 -> B 3.0: exactly what rested on B 2.0 is redone.
    before = {a["artifact_id"]: a for a in arts}
    b_chain = {
        i for i, a in before.items()
        if a["valid"] and a["kind"] in ("source_snapshot", "evidence", "claim")
        and a["name"] == "B"
    }  # fmt: skip
    a_chain = {
        i for i, a in before.items()
        if a["valid"] and a["kind"] in ("source_snapshot", "evidence", "claim")
        and a["name"] == "A"
    }  # fmt: skip
    built = {
        i for i, a in before.items() if a["valid"] and a["kind"] in ("report_section", "report")
    }
    sc("edit", sc.task, "--source", "B=3.0@corpus/b-3.0.md", "--reason", "B 3.0 is out")
    arts = {a["artifact_id"]: a for a in sc.artifacts()}
    assert {i for i in before if before[i]["valid"] and not arts[i]["valid"]} == b_chain | built
    assert all("changed from version 2.0 to 3.0" in arts[i]["invalid_reason"] for i in b_chain)
    doc = sc.status()
    assert [(s["id"], s["version"]) for s in doc["sources"]] == [("A", "1.0"), ("B", "3.0")]
    assert {a["artifact_id"] for a in doc["artifacts"]["invalid"]} >= b_chain | built
    assert {i["id"]: i["status"] for i in doc["ledger"]["items"]} == {
        "claims_a": "done", "claims_b": "pending", "sections": "pending", "report": "pending",
        "ticket": "done",
    }  # fmt: skip
    shown = sc("status", sc.task).stdout
    assert "sources: A 1.0 (snapshot), B 3.0 (snapshot)" in shown and "invalid artifact" in shown
    tree = sc("artifacts", sc.task, "--tree", "--invalid").stdout
    assert all(i in tree for i in b_chain)

    err = sc.worker()
    assert f"task {sc.task}: satisfied (delivered)" in err
    assert_delivered(sc, info["open_after"])
    evs = sc.events()
    arts = {a["artifact_id"]: a for a in sc.artifacts()}
    # A was kept and not read again; B 3.0 read once; A's claims still serve.
    snaps_now = by_kind(list(arts.values()), "source_snapshot")
    assert sorted((a["name"], a["artifact_id"] in before) for a in snaps_now) == [
        ("A", True), ("B", False)
    ]  # fmt: skip
    assert all(n == 1 for n in reads(evs).values()) and len(reads(evs)) == 3
    assert all(arts[i]["valid"] for i in a_chain)
    b3 = [a for a in by_kind(list(arts.values()), "claim") if a["name"] == "B"]
    assert len(b3) == 4 and not {i for a in b3 for i in deps_of(a)} & b_chain
    text = (sc.ws / REPORT).read_text()
    assert "B 3.0" in text and "B 2.0" not in text
    # Still exactly one ticket: the edit did not file the open questions again.
    assert len(api.tickets()) == 1 and len(api.stats()["posts"]) == 1
    assert [d["tool"] for d in of(evs, "op.intended")].count("create_ticket") == 1
