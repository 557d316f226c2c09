"""`tether artifacts` and `tether edit --source` through the CLI."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import yaml

from tests.support.cli import assert_clean_error, assert_ok, json_out, tether
from tether.store import open_store
from tether.store.base import ArtifactRecord, blob_hash


def _record(tid: str, ident: str, kind: str, *deps: str) -> ArtifactRecord:
    data = ident.encode()
    return ArtifactRecord(ident, tid, kind, ident, blob_hash(data), len(data), deps=deps)


async def _add_artifacts(db: Path, tid: str) -> None:
    store = await open_store(f"sqlite:///{db}")
    try:
        arts = [
            _record(tid, "snapA", "source_snapshot", "source:A@1.0"),
            _record(tid, "snapB", "source_snapshot", "source:B@2.0"),
            _record(tid, "evB", "evidence", "artifact:snapB", "source:B@2.0"),
            _record(tid, "claimB", "claim", "artifact:evB"),
        ]
        blobs = [a.artifact_id.encode() for a in arts]
        await store.commit(tid, None, [], artifacts=arts, blobs=blobs)
    finally:
        await store.close()


def test_artifacts_and_a_new_source_version(tmp_path: Path) -> None:
    spec = {
        "name": "cmp",
        "objective": "compare A and B",
        "items": [{"id": "i", "title": "t"}],
        "sources": [
            {"id": "A", "version": "1.0", "location": "a.md"},
            {"id": "B", "version": "2.0", "location": "b.md"},
        ],
    }
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    tid = json_out(tether("submit", "spec.yaml", "--json", cwd=tmp_path))["task_id"]
    asyncio.run(_add_artifacts(tmp_path / ".tether" / "tether.db", tid))

    listed = json_out(tether("artifacts", tid, "--json", cwd=tmp_path))
    assert sorted(a["artifact_id"] for a in listed) == ["claimB", "evB", "snapA", "snapB"]
    res = tether("artifacts", tid, "--tree", cwd=tmp_path)
    assert_ok(res)
    assert res.stdout.index("snapB") < res.stdout.index("evB") < res.stdout.index("claimB")

    assert_clean_error(tether("edit", tid, "--source", "Z=3", cwd=tmp_path), 2, "no source 'Z'")
    assert_clean_error(tether("edit", tid, "--source", "B", cwd=tmp_path), 2, "ID=VERSION")
    assert_clean_error(tether("artifacts", "t-nope", cwd=tmp_path), 3)
    assert_ok(tether("edit", tid, "--source", "B=3.0", cwd=tmp_path))

    invalid = json_out(tether("artifacts", tid, "--invalid", "--json", cwd=tmp_path))
    assert sorted(a["artifact_id"] for a in invalid) == ["claimB", "evB", "snapB"]
    assert all("version 2.0 to 3.0" in a["invalid_reason"] for a in invalid)
    status = json_out(tether("status", tid, "--json", cwd=tmp_path))
    assert status["version"] == 2
    assert [(s["id"], s["version"]) for s in status["sources"]] == [("A", "1.0"), ("B", "3.0")]
    assert status["artifacts"]["invalid_count"] == 3
    shown = tether("status", tid, cwd=tmp_path)
    assert "sources: A 1.0 (snapshot), B 3.0 (snapshot); 3 invalid artifacts" in shown.stdout
    assert json_out(tether("rebuild", tid, "--json", cwd=tmp_path))["consistent"] is True
    assert "agree with the event log" in tether("rebuild", tid, cwd=tmp_path).stdout
    assert_clean_error(tether("rebuild", "t-nope", cwd=tmp_path), 3)
    events = json.loads(tether("events", tid, "--json", cwd=tmp_path).stdout)
    assert "artifacts.invalidated" in [e["type"] for e in events]
