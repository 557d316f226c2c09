"""`tether demo` end to end from the CLI, its outputs checked independently.

The demo runs once per module (`--dir`, `--json`) in a subprocess; the tests then read
its files against `tether.demo.ground_truth()` and its database through `tether status`
and `tether events`, not through the demo's own acceptance checks.
"""

from __future__ import annotations

import csv
import json
import re
import stat
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import assert_ok, cli_env, json_out, tether, tether_many
from tether.demo import BROKEN, N_DOCS, doc_id, ground_truth

DEMO_TIMEOUT = 110.0


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run `tether demo --dir D --json` once; its folder, JSON output and the database's
    status document and events, read back through the CLI."""
    base = tmp_path_factory.mktemp("demo")
    folder = base / "catalogue"
    proc = tether("demo", "--dir", folder, "--json", cwd=base, timeout=DEMO_TIMEOUT)
    out = json_out(proc)
    db = f"sqlite:///{folder / '.tether' / 'tether.db'}"
    tid = out["status"]["task_id"]
    status_p, events_p = tether_many(
        [
            (("status", tid, "--json", "--db", db), base),
            (("events", tid, "--json", "--db", db), base),
        ]
    )
    return {
        "folder": folder,
        "out": out,
        "db": db,
        "task_id": tid,
        "status": json_out(status_p),
        "events": json_out(events_p),
        "stderr": proc.stderr,
    }


def readable() -> dict[str, dict[str, str]]:
    return {k: v for k, v in ground_truth().items() if k != BROKEN}


# --- the files it made -----------------------------------------------------------------------


def test_catalog_has_a_correct_row_for_every_readable_document(demo: dict[str, Any]) -> None:
    with (demo["folder"] / "catalog.csv").open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == ["path", "title", "date", "topic"]
        rows = list(reader)
    assert len(rows) == N_DOCS - 1 == 39
    paths = [r["path"] for r in rows]
    assert len(set(paths)) == len(paths), "one row per document"
    by_doc = {Path(r["path"]).stem: r for r in rows}
    assert BROKEN not in by_doc
    truth = readable()
    assert set(by_doc) == set(truth)
    for name, meta in truth.items():
        row = by_doc[name]
        assert row["path"] == f"docs/{name}.txt"
        assert (row["title"], row["date"], row["topic"]) == (
            meta["title"],
            meta["date"],
            meta["topic"],
        ), name


def test_records_and_documents(demo: dict[str, Any]) -> None:
    folder = demo["folder"]
    docs = sorted(p.name for p in (folder / "docs").iterdir())
    assert docs == [f"{doc_id(n)}.txt" for n in range(1, N_DOCS + 1)]
    records = {
        p.stem: json.loads(p.read_text("utf-8")) for p in (folder / "records").glob("*.json")
    }
    assert records == readable()


def test_summary_counts_and_failed_document(demo: dict[str, Any]) -> None:
    text = (demo["folder"] / "summary.md").read_text(encoding="utf-8")
    assert text.startswith("# Catalogue summary")
    assert "39 documents catalogued" in text
    counts = Counter(v["topic"] for v in readable().values())
    assert sum(counts.values()) == 39
    table = dict(re.findall(r"^\| (\w+) \| (\d+) \|$", text, re.M))
    assert {k: int(v) for k, v in table.items()} == dict(counts)
    failed = text.split("could not be parsed", 1)[1]
    assert f"docs/{BROKEN}.txt" in failed
    assert [ln for ln in failed.splitlines() if ln.startswith("- ")] == [f"- docs/{BROKEN}.txt"]


def test_notice_for_the_team(demo: dict[str, Any]) -> None:
    text = (demo["folder"] / "notice.md").read_text(encoding="utf-8")
    assert text.startswith("# ")
    assert "catalog.csv" in text and "summary.md" in text
    assert len(text) < 2000


def test_outputs_are_as_readable_as_the_files_the_demo_wrote_itself(demo: dict[str, Any]) -> None:
    """The catalogue and the notice are for the team: the agent's `write_file` should
    create files with the usual permissions (0666 minus the umask), like the demo's own
    documents, not the 0600 of a temporary file it renamed into place."""
    folder = demo["folder"]
    usual = stat.S_IMODE((folder / "docs" / "doc-01.txt").stat().st_mode)
    for name in ("catalog.csv", "summary.md", "notice.md"):
        mode = stat.S_IMODE((folder / name).stat().st_mode)
        assert mode == usual, f"{name} has mode {mode:o}, the demo's own files {usual:o}"


# --- what the database says -------------------------------------------------------------------


def test_status_satisfied_with_the_broken_document_waived(demo: dict[str, Any]) -> None:
    doc = demo["status"]
    assert (doc["status"], doc["stop_reason"]) == ("satisfied", "delivered_with_waivers")
    assert [w["id"] for w in doc["waivers"]] == [BROKEN]
    items = {i["id"]: i for i in doc["ledger"]["items"]}
    expected_ids = [doc_id(n) for n in range(1, N_DOCS + 1)] + ["catalog", "summary", "notice"]
    assert [i["id"] for i in doc["ledger"]["items"]] == expected_ids
    broken = items.pop(BROKEN)
    assert broken["status"] == "waived"
    assert broken["evidence"] == []
    assert "corrupted scan" in broken["note"], "a waived item says why"
    for item_id, item in items.items():
        assert item["status"] == "done", item_id
        assert item["evidence"], item_id
    # Every evidence ref resolves to a committed op or a stored artifact in the log.
    evs = demo["events"]
    committed = {f"op:{e['data']['op_id']}" for e in evs if e["type"] == "op.committed"}
    artifacts = {
        f"artifact:{e['data']['artifact_id']}" for e in evs if e["type"] == "artifact.stored"
    }
    for item_id, item in items.items():
        for ref in item["evidence"]:
            assert ref in committed | artifacts, (item_id, ref)
    # The document items were proven by writing their record.
    ops = {f"op:{e['data']['op_id']}": e["data"] for e in evs if e["type"] == "op.intended"}
    for name in readable():
        assert any(ops.get(ref, {}).get("tool") == "write_file" for ref in items[name]["evidence"])


def test_events_show_compaction_a_verdict_per_round_and_the_blocked_item(
    demo: dict[str, Any],
) -> None:
    evs = demo["events"]
    assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))
    types = Counter(e["type"] for e in evs)
    assert types["context.compacted"] >= 1
    rounds = [e["data"]["round"] for e in evs if e["type"] == "round.started"]
    verdicts = [e["data"]["round"] for e in evs if e["type"] == "judge.verdict"]
    assert rounds == list(range(1, len(rounds) + 1))
    assert verdicts == rounds, "one judge.verdict for every round"
    assert demo["status"]["budget"]["used"]["rounds"] == len(rounds)
    blocked = [
        e["data"]
        for e in evs
        if e["type"] == "audit.warning" and e["data"]["code"] == "item_blocked"
    ]
    assert [w["details"].get("item") for w in blocked] == [BROKEN]
    # Blocked is not finished: the task waited for a decision, the demo's user waived it.
    asked = [e["data"] for e in evs if e["type"] == "decision.requested"]
    assert len(asked) == 1
    assert [b["id"] for b in asked[0]["partial"]["blocked"]] == [BROKEN]
    assert len(asked[0]["partial"]["done"]) == 42 and not asked[0]["partial"]["remaining"]
    waived = [e["data"] for e in evs if e["type"] == "item.waived"]
    assert [(w["item"], w["by"]) for w in waived] == [(BROKEN, "demo user")]
    order = [e["type"] for e in evs if e["type"] in ("decision.requested", "item.waived")]
    assert order == ["decision.requested", "item.waived"]
    checks = [e["data"] for e in evs if e["type"] == "completion.checked"]
    assert checks and checks[-1]["passed"]
    assert {r["id"] for r in checks[-1]["results"]} == {
        "catalog-correct",
        "summary-correct",
        "notice-written",
    }
    last = evs[-1]
    assert last["type"] == "task.status"
    assert (last["data"]["dst"], last["data"]["stop_reason"]) == (
        "satisfied",
        "delivered_with_waivers",
    )


def test_compaction_never_marks_work_done(demo: dict[str, Any]) -> None:
    """The ledger only changes through audited verdicts: no ledger.updated comes from
    a compaction, and every done transition cites evidence."""
    for e in demo["events"]:
        if e["type"] != "ledger.updated":
            continue
        assert e["data"].get("cause") != "compaction"
        for change in e["data"]["diff"]:
            if change.get("field") == "status" and change.get("after") == "done":
                assert any(
                    c.get("item") == change.get("item") and c.get("field") == "evidence"
                    for c in e["data"]["diff"]
                ), change


# --- the command's own output --------------------------------------------------------------


def test_demo_json_output(demo: dict[str, Any]) -> None:
    out = demo["out"]
    assert set(out) == {"status", "summary"}
    assert out["status"] == demo["status"]
    summary = out["summary"]
    assert summary["result"] == f"satisfied (delivered_with_waivers: {BROKEN})"
    assert summary["ledger"] == "42/43 done, 0 blocked, 1 waived"
    assert summary["blocked or waived"].startswith(f"{BROKEN}: waived by demo user")
    assert int(summary["compactions"]) >= 1
    assert "item_blocked" in summary["audit warnings"]
    assert summary["outputs"] == "catalog.csv, summary.md, notice.md"
    assert summary["events"] == len(demo["events"])
    assert "Traceback" not in demo["stderr"]


def test_demo_in_a_temporary_folder_prints_what_happened(tmp_path: Path) -> None:
    """Without `--dir` the demo works in a new temporary folder (here under TMPDIR)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = tether("demo", cwd=tmp_path, env=cli_env(TMPDIR=str(tmp)), timeout=DEMO_TIMEOUT)
    assert_ok(proc)
    assert "what happened" in proc.stdout
    assert f"satisfied (delivered_with_waivers: {BROKEN})" in proc.stdout
    assert "doc-23" in proc.stdout
    assert "Traceback" not in proc.stderr
    made = [p for p in tmp.iterdir() if p.name.startswith("tether-demo-")]
    assert len(made) == 1
    assert (made[0] / "catalog.csv").is_file()
    m = re.search(r"tether timeline (\S+) --db (\S+)", proc.stdout)
    assert m, proc.stdout
    timeline = tether("timeline", m.group(1), "--db", m.group(2), cwd=tmp_path)
    assert_ok(timeline)
    assert "satisfied (delivered_with_waivers)" in timeline.stdout
    assert "item.waived" in timeline.stdout
    assert not (tmp_path / ".tether").exists(), "the demo keeps its database in its folder"
