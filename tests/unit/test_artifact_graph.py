"""The artifact dependency graph: exact, transitive invalidation, the items it reopens,
the tree `tether artifacts --tree` shows, and `--source` edits."""

from __future__ import annotations

import pytest

from tether import artifacts as A
from tether import errors
from tether import ledger as L
from tether.runtime.judge.judges import RoundFacts, audit, rule_verdict
from tether.spec import Limits, parse_spec
from tether.store.base import ArtifactRecord


def art(ident: str, kind: str, *deps: str) -> ArtifactRecord:
    return ArtifactRecord(ident, "t", kind, ident, "sha256:x", 1, deps=deps)


GRAPH = [
    art("snapA", "source_snapshot", "source:A@1.0"),
    art("snapB", "source_snapshot", "source:B@2.0"),
    art("evA", "evidence", "artifact:snapA", "source:A@1.0"),
    art("evB", "evidence", "artifact:snapB", "source:B@2.0"),
    art("claimA", "claim", "artifact:evA"),
    art("claimB", "claim", "artifact:evB"),
    art("claimAB", "claim", "artifact:evA", "artifact:evB"),
    art("section", "report_section", "artifact:claimA", "artifact:claimB"),
    art("report", "report", "artifact:section"),
    art("notes", "summary"),
]


def test_dependents_are_exactly_the_transitive_users() -> None:
    hit = {a.artifact_id for a in A.dependents(GRAPH, ["source:B@2.0"])}
    assert hit == {"snapB", "evB", "claimB", "claimAB", "section", "report"}
    assert {a.artifact_id for a in A.dependents(GRAPH, ["source:A@9"])} == set()


def test_invalid_artifacts_are_not_followed_again() -> None:
    gone = A.invalidated([GRAPH[1]], "x")
    graph = [gone[0], *GRAPH[2:]]
    assert gone[0].meta[A.INVALIDATED]["reason"] == "x" and not gone[0].valid
    # snapB is history already: invalidating again finds only what is still current.
    found = {a.artifact_id for a in A.dependents(graph, ["source:B@2.0"])}
    assert found == {"evB", "claimB", "claimAB", "section", "report"}


def test_plan_reopens_items_citing_invalidated_artifacts() -> None:
    led = L.from_spec("o", [("a", "A", None), ("b", "B", None), ("s", "S", None)])
    led = L.complete(led, "a", ["artifact:claimA"]).ledger
    led = L.complete(led, "b", ["artifact:claimB"]).ledger
    led = L.complete(led, "s", ["artifact:section", "op:x"]).ledger
    plan = A.plan_invalidation(GRAPH, led, {"source:B@2.0": "B went to 3.0"}, version=2)
    assert plan.reopened == ["b", "s"]
    assert plan.ledger.item("a").status == "done"
    assert "B went to 3.0" in plan.ledger.item("b").note
    assert {r.artifact_id for r in plan.records} == {
        "snapB",
        "evB",
        "claimB",
        "claimAB",
        "section",
        "report",
    }
    assert all(r.meta[A.INVALIDATED]["task_version"] == 2 for r in plan.records)


def _spec(version: str = "2.0", location: str = "b.md") -> object:
    return parse_spec(
        {
            "objective": "o",
            "items": [{"id": "i", "title": "t"}],
            "sources": [
                {"id": "A", "version": "1.0", "location": "a.md"},
                {"id": "B", "version": version, "location": location},
            ],
        }
    )


def test_changed_sources() -> None:
    old = _spec()
    assert A.changed_sources(old, _spec()) == {}  # type: ignore[arg-type]
    assert list(A.changed_sources(old, _spec("3.0"))) == ["source:B@2.0"]  # type: ignore[arg-type]
    assert "moved" in A.changed_sources(old, _spec(location="c.md"))["source:B@2.0"]  # type: ignore[arg-type]


def test_source_changes_for_the_cli() -> None:
    spec = _spec().model_dump(mode="json")  # type: ignore[attr-defined]
    out = A.source_changes(spec, ["B=3.0@b3.md"])
    assert out["sources"][1] == {**spec["sources"][1], "version": "3.0", "location": "b3.md"}
    assert out["sources"][0] == spec["sources"][0]
    for bad in ("Z=1", "B", "=2", "B="):
        with pytest.raises(errors.UserError):
            A.source_changes(spec, [bad])


def test_tree_puts_users_under_what_they_were_made_from() -> None:
    forest = A.tree(GRAPH)
    roots = [n["artifact_id"] for n in forest]
    assert roots == ["snapA", "snapB", "notes"]
    ev_b = forest[1]["children"][0]
    assert ev_b["artifact_id"] == "evB"
    assert [c["artifact_id"] for c in ev_b["children"]] == ["claimB", "claimAB"]


def test_spec_sources_and_artifact_rules() -> None:
    with pytest.raises(errors.SpecError, match="sources: id 'A' is used more than once"):
        parse_spec(
            {
                "objective": "o",
                "items": [{"id": "i", "title": "t"}],
                "sources": [{"id": "A", "version": "1", "location": "a"}] * 2,
            }
        )
    with pytest.raises(errors.SpecError, match="give name, artifact_kind or both"):
        parse_spec(
            {
                "objective": "o",
                "items": [{"id": "i", "title": "t", "done_when": {"kind": "artifact"}}],
            }
        )
    spec = parse_spec(
        {
            "objective": "o",
            "items": [
                {
                    "id": "i",
                    "title": "t",
                    "done_when": {"kind": "artifact", "artifact_kind": "claim", "min_count": 3},
                }
            ],
        }
    )
    assert spec.items[0].done_when.min_count == 3  # type: ignore[union-attr]


class _Env:
    """A rule environment whose only valid artifact is `current`."""

    workspace = None
    preexisting: dict[str, str] = {}  # noqa: RUF012

    async def succeeded_ops(self, tools: object = ()) -> list[object]:
        return []

    async def valid_artifacts(self) -> list[ArtifactRecord]:
        return [art("current", "claim")]

    async def current_ops(self, op_ids: object) -> set[str]:
        return set()

    async def record_evidence(self, item_id: str, text: str, meta: object = None) -> str:
        raise AssertionError("no rule here records evidence")


@pytest.mark.parametrize("pin", ["fingerprint", "snapshot"])
async def test_items_citing_invalidated_artifacts_reopen_mid_run(pin: str) -> None:
    spec = parse_spec(
        {
            "objective": "o",
            "items": [{"id": "a", "title": "A"}, {"id": "b", "title": "B"}],
            "sources": [{"id": "C", "version": "1", "location": "c.csv", "pin": pin}],
        }
    )
    led = L.from_spec("o", [("a", "A", None), ("b", "B", None)])
    led = L.complete(led, "a", ["artifact:gone"]).ledger
    led = L.complete(led, "b", ["artifact:current"]).ledger
    verdict = await rule_verdict(spec, led, _Env())  # type: ignore[arg-type]
    if pin == "snapshot":
        # Snapshots change only by an edit, which reopens the items itself.
        assert verdict.changes == ()
        return
    assert [(c.item_id, c.status) for c in verdict.changes] == [("a", "pending")]
    out = audit(led, [verdict], evidence={}.get, facts=RoundFacts(3, None, ""), limits=Limits())
    assert out.update.ledger.item("a").status == "pending"
    assert "no longer valid" in out.update.ledger.item("a").note
    assert out.update.ledger.item("b").status == "done"
