"""Reading tasks through the real CLI: `run`, `status`, `events`, `timeline`, `list`,
`cancel` (the public contract: `status --json` fields and exit codes).

A three-item task is run once per module with a scripted policy (`tests.e2e.policies`)
whose items are judged by `done_when` op rules; the read commands are then checked
against it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import (
    DONE,
    assert_clean_error,
    assert_ok,
    json_out,
    tether,
    tether_many,
    write_spec,
)

STATUS_FIELDS = {"task_id", "version", "status", "stop_reason", "ledger", "budget", "waiting"}
ITEM_FIELDS = {"id", "title", "status", "evidence", "attempts"}


@pytest.fixture(scope="module")
def delivered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A task run to delivery with `tether run --json` in a folder of its own, using the
    default database `.tether/tether.db` there."""
    folder = tmp_path_factory.mktemp("status")
    write_spec(folder / "spec.yaml", 3, name="three-files")
    proc = tether("run", "spec.yaml", "--model", DONE, "--json", cwd=folder)
    assert_ok(proc)
    return {"folder": folder, "doc": json_out(proc), "proc": proc}


def test_run_exits_0_on_delivery_and_does_the_work(delivered: dict[str, Any]) -> None:
    doc, folder = delivered["doc"], delivered["folder"]
    assert (doc["status"], doc["stop_reason"]) == ("satisfied", "delivered")
    for n in (1, 2, 3):
        assert (folder / "out" / f"i{n}.txt").read_text() == f"i{n} done\n"
    assert (folder / ".tether" / "tether.db").is_file()


def test_run_without_json_prints_progress_and_the_final_status(tmp_path: Path) -> None:
    write_spec(tmp_path / "spec.yaml", 2)
    proc = tether("run", "spec.yaml", "--model", DONE, cwd=tmp_path)
    assert_ok(proc)
    m = re.search(r"task (\S+) created \(2 items\)", proc.stdout)
    assert m, proc.stdout
    assert "satisfied" in proc.stdout and "delivered" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_status_json_has_the_documented_fields(delivered: dict[str, Any]) -> None:
    tid = delivered["doc"]["task_id"]
    doc = json_out(tether("status", tid, "--json", cwd=delivered["folder"]))
    assert doc.keys() >= STATUS_FIELDS
    assert doc["task_id"] == tid
    assert doc["version"] == 1
    assert (doc["status"], doc["stop_reason"]) == ("satisfied", "delivered")
    assert doc["waiting"] is None
    ledger = doc["ledger"]
    assert ledger.keys() >= {"objective", "items"}
    assert ledger["objective"] == "Write 3 small files under out/"
    assert [i["id"] for i in ledger["items"]] == ["i1", "i2", "i3"]
    for item in ledger["items"]:
        assert item.keys() >= ITEM_FIELDS
        assert item["title"] == f"Write out/{item['id']}.txt"
        assert item["status"] == "done"
        assert isinstance(item["attempts"], int)
        assert item["evidence"] and all(isinstance(e, str) for e in item["evidence"])
        assert all(e.startswith(("op:", "artifact:")) for e in item["evidence"])
    assert isinstance(doc["budget"], dict)
    assert doc["budget"]["used"]["rounds"] == 3
    assert doc["budget"]["used"]["model_calls"] >= 3
    # `run --json` printed the same document (nothing happened to the task since).
    assert delivered["doc"] == doc


def test_status_human_view(delivered: dict[str, Any]) -> None:
    tid = delivered["doc"]["task_id"]
    proc = tether("status", tid, cwd=delivered["folder"])
    assert_ok(proc)
    for text in (tid, "three-files", "satisfied", "delivered", "3/3 done", "i1", "i2", "i3"):
        assert text in proc.stdout, text


def test_events_json_after_type_and_limit(delivered: dict[str, Any]) -> None:
    tid, folder = delivered["doc"]["task_id"], delivered["folder"]
    full_p, after_p, types_p, limit_p = tether_many(
        [
            (("events", tid, "--json"), folder),
            (("events", tid, "--json", "--after", "10"), folder),
            (
                ("events", tid, "--json", "--type", "judge.verdict", "--type", "round.started"),
                folder,
            ),
            (("events", tid, "--json", "--after", "3", "--limit", "2"), folder),
        ]
    )
    full = json_out(full_p)
    seqs = [e["seq"] for e in full]
    assert seqs == list(range(1, len(full) + 1)), "seq is gapless from 1"
    for e in full:
        assert e.keys() >= {"task_id", "seq", "type", "data", "at"}
        assert e["task_id"] == tid
    assert full[0]["type"] == "task.created"
    # The run's last word is its end, then its own notice of it (sent once, as no worker
    # will send it again).
    end = max(e["seq"] for e in full if e["type"] == "task.status")
    assert (full[end - 1]["data"]["dst"], full[end - 1]["data"]["stop_reason"]) == (
        "satisfied",
        "delivered",
    )
    assert [e["type"] for e in full[end:]] == ["notice.sent"] * len(full[end:])
    assert [e["at"] for e in full] == sorted(e["at"] for e in full)

    assert json_out(after_p) == [e for e in full if e["seq"] > 10]

    picked = json_out(types_p)
    assert picked == [e for e in full if e["type"] in ("judge.verdict", "round.started")]
    verdicts = [e["data"] for e in picked if e["type"] == "judge.verdict"]
    assert [v["round"] for v in verdicts] == [1, 2, 3]
    assert [v["decision"] for v in verdicts] == ["continue", "continue", "satisfied"]
    assert [(v["done"], v["total"]) for v in verdicts] == [(1, 3), (2, 3), (3, 3)]

    assert [e["seq"] for e in json_out(limit_p)] == [4, 5]

    # The ledger's evidence resolves to ops the log shows committed.
    committed = {f"op:{e['data']['op_id']}" for e in full if e["type"] == "op.committed"}
    for item in delivered["doc"]["ledger"]["items"]:
        assert set(item["evidence"]) <= committed, item


def test_events_plain_and_past_the_end(delivered: dict[str, Any]) -> None:
    tid, folder = delivered["doc"]["task_id"], delivered["folder"]
    plain, past = tether_many(
        [(("events", tid), folder), (("events", tid, "--json", "--after", "100000"), folder)]
    )
    assert_ok(plain)
    lines = plain.stdout.splitlines()
    assert lines and re.match(r"\s*1 .*task\.created", lines[0]), lines[:2]
    assert json_out(past) == []


def test_timeline_prints_readable_lines(delivered: dict[str, Any]) -> None:
    tid, folder = delivered["doc"]["task_id"], delivered["folder"]
    proc = tether("timeline", tid, cwd=folder)
    assert_ok(proc)
    lines = proc.stdout.splitlines()
    assert len(lines) == delivered["doc"]["last_seq"], "one line per event"
    assert all(re.match(r"\s*\d+ \d\d:\d\d:\d\d ", ln) for ln in lines), lines[:3]
    text = proc.stdout
    assert "task.created" in text
    assert "round 1 on i1" in text
    assert "round 3 verdict satisfied: 3/3 done" in text
    assert "queued → running" in text
    assert "running → satisfied (delivered)" in text
    assert "\x1b[" not in text, "no colour codes when the output is not a terminal"


def test_list_shows_the_task(delivered: dict[str, Any]) -> None:
    tid, folder = delivered["doc"]["task_id"], delivered["folder"]
    plain, as_json = tether_many([(("list",), folder), (("list", "--json"), folder)])
    assert_ok(plain)
    assert tid in plain.stdout and "three-files" in plain.stdout and "satisfied" in plain.stdout
    rows = json_out(as_json)
    assert [(r["task_id"], r["name"], r["status"], r["stop_reason"]) for r in rows] == [
        (tid, "three-files", "satisfied", "delivered")
    ]


def test_cancel_of_a_finished_task_changes_nothing(delivered: dict[str, Any]) -> None:
    tid, folder = delivered["doc"]["task_id"], delivered["folder"]
    proc = tether("cancel", tid, cwd=folder)
    assert_ok(proc)
    assert "already satisfied" in proc.stdout
    doc = json_out(tether("status", tid, "--json", cwd=folder))
    assert (doc["status"], doc["stop_reason"]) == ("satisfied", "delivered")
    assert doc["last_seq"] == delivered["doc"]["last_seq"]


async def test_cancel_of_a_queued_task(tmp_path: Path) -> None:
    """A queued task nobody runs (no lease) is cancelled at once."""
    from tether.runtime.tasks import create_task
    from tether.spec import load_spec
    from tether.store import open_store

    spec = load_spec(write_spec(tmp_path / "spec.yaml", 2))
    store = await open_store(f"sqlite:///{tmp_path / '.tether' / 'tether.db'}")
    try:
        task = await create_task(store, spec, workspace=tmp_path)
    finally:
        await store.close()
    tid = task.task_id
    before = json_out(tether("status", tid, "--json", cwd=tmp_path))
    assert before["status"] == "queued"

    proc = tether("cancel", tid, cwd=tmp_path)
    assert_ok(proc)
    assert "cancelled" in proc.stdout

    doc_p, evs_p, again, resume = tether_many(
        [
            (("status", tid, "--json"), tmp_path),
            (("events", tid, "--json", "--after", str(before["last_seq"])), tmp_path),
            (("cancel", tid), tmp_path),
            (("resume", tid, "--model", DONE), tmp_path),
        ]
    )
    doc = json_out(doc_p)
    assert (doc["status"], doc["stop_reason"]) == ("cancelled", "cancelled_by_user")
    assert all(i["status"] == "pending" for i in doc["ledger"]["items"])
    types = [e["type"] for e in json_out(evs_p)]
    assert types == ["task.cancel_requested", "task.status"]
    status_ev = json_out(evs_p)[-1]["data"]
    assert (status_ev["src"], status_ev["dst"]) == ("queued", "cancelled")
    assert_ok(again)
    assert "already cancelled" in again.stdout
    assert_clean_error(resume, 2, "cancelled")
    assert not (tmp_path / "out").exists(), "a cancelled task did no work"


def test_run_that_ends_waiting_then_cancel(tmp_path: Path) -> None:
    """A scripted model that runs out of answers leaves the task waiting (not a crash:
    exit 0, status says why); `cancel` then ends it."""
    write_spec(tmp_path / "spec.yaml", 2)
    (tmp_path / "one-answer.yaml").write_text("- I am thinking about it.\n", encoding="utf-8")
    proc = tether("run", "spec.yaml", "--model", "scripted:one-answer.yaml", "--json", cwd=tmp_path)
    doc = json_out(proc)
    assert doc["status"] == "waiting", doc
    assert doc["stop_reason"] is None
    assert doc["waiting"] and "ran out" in str(doc["waiting"])
    assert_ok(tether("cancel", doc["task_id"], cwd=tmp_path))
    after = json_out(tether("status", doc["task_id"], "--json", cwd=tmp_path))
    assert (after["status"], after["stop_reason"]) == ("cancelled", "cancelled_by_user")
    assert after["waiting"] is None


def test_names_and_text_with_square_brackets_are_printed_verbatim(tmp_path: Path) -> None:
    """A task's name, objective or any text in its events is data, not rich markup:
    `[b]` must not vanish and `[/draft]` must not crash the command."""
    name = "tidy [/draft]"
    objective = "Tidy the [b]docs[/b] folder; see [the guide](GUIDE.md)"
    write_spec(tmp_path / "spec.yaml", 1, name=name, objective=objective)
    doc = json_out(tether("run", "spec.yaml", "--model", DONE, "--json", cwd=tmp_path))
    assert (doc["name"], doc["ledger"]["objective"]) == (name, objective)
    tid = doc["task_id"]
    listing, events, status, timeline = tether_many(
        [
            (("list",), tmp_path),
            (("events", tid), tmp_path),
            (("status", tid), tmp_path),
            (("timeline", tid), tmp_path),
        ]
    )
    procs = {"list": listing, "events": events, "status": status, "timeline": timeline}
    broken = {
        cmd: p.stderr.strip().splitlines()[-1:]
        for cmd, p in procs.items()
        if p.returncode != 0 or "Traceback" in p.stderr
    }
    assert not broken, broken
    assert name in listing.stdout
    assert objective in events.stdout
    assert name in status.stdout and objective in status.stdout
    assert objective in timeline.stdout
