"""The SQL stores' per-call shortcuts keep what they replace: PostgreSQL's commit text
built once per shape (`_pg_commit`), records written without deep copies and read by
a reader made once per class (`_rows`)."""

from __future__ import annotations

import dataclasses
import json
import re

from tether import events as ev
from tether.store import _pg_commit as pg_commit
from tether.store import _rows
from tether.store import _rules as rules
from tether.store._sql import _dumps
from tether.store.base import Commit, LedgerWrite, OpRecord, StoredEvent, TaskPatch


def _statement(c: Commit) -> tuple[str, dict[str, object]]:
    cond = rules.CommitCondition.of(c.task_id, c.token, c.task, c.ledger)
    text, params = pg_commit.statement(cond, c, 1.0, (), dict)
    return text.decode("ascii"), params


def test_commits_of_one_shape_share_one_text() -> None:
    first, p1 = _statement(Commit("t", 3, [ev.CancelRequested()], TaskPatch(status="running")))
    again, p2 = _statement(Commit("u", 4, [ev.PauseRequested()], TaskPatch(status="running")))
    assert first == again
    c = Commit("t", 3, [], TaskPatch(status="running"))
    cond = rules.CommitCondition.of(c.task_id, c.token, c.task, c.ledger)
    assert (
        pg_commit.statement(cond, c, 1.0, (), dict)[0]
        is pg_commit.statement(cond, c, 2.0, (), dict)[0]
    )  # one object: psycopg finds its parsed form without hashing a new text
    assert (p1["id"], p2["id"], p1["tok"], p2["tok"]) == ("t", "u", 3, 4)
    # Every `:name` became psycopg's placeholder; casts (`::jsonb`) stay.
    assert re.search(r"(?<![:\w]):\w", first) is None
    assert set(re.findall(r"%\((\w+)\)s", first)) <= set(p1)


def test_another_shape_gets_its_own_text() -> None:
    plain, _ = _statement(Commit("t", 3, []))
    led, params = _statement(Commit("t", 3, [], ledger=LedgerWrite({"i": {}}, 2, 1)))
    assert plain != led and "ledgers" in led and "ledgers" not in plain
    assert params["litems"] == '[{"id":"i","pos":0,"body":{}}]'


def test_a_status_change_checks_its_sources_as_an_array_literal() -> None:
    text, params = _statement(Commit("t", 3, [], TaskPatch(status="running")))
    assert "status = ANY(%(src)s::text[])" in text
    sources = rules.allowed_sources("running", None)
    assert params["src"] == "{" + ",".join(f'"{s}"' for s in sorted(sources)) + "}"


@dataclasses.dataclass(frozen=True)
class _Inner:
    x: int


def test_records_are_written_as_asdict_gives_them() -> None:
    op = OpRecord("o", "t", 1, 0, "tool", {"a": [1, {"b": 2}]}, "h", "write", "intended")
    assert json.loads(_rows.record_json([op], _dumps)) == [dataclasses.asdict(op)]
    odd = OpRecord("o", "t", 1, 0, "tool", {"a": _Inner(1)}, "h", "write", "intended")
    assert json.loads(_rows.record_json([odd], _dumps))[0]["args"] == {"a": {"x": 1}}


def test_a_reader_reads_as_the_annotations_say() -> None:
    row = {
        **{f.name: None for f in dataclasses.fields(OpRecord)},
        **{"op_id": "o", "task_id": "t", "round": "2", "call_index": 0, "tool": "x"},
        **{"args": '{"a": 1}', "args_hash": "h", "effect": "write", "status": "done"},
        **{"attempts": 1, "result": '{"summary": 2, "content": "abc"}', "task_version": 1},
        **{"created_at": 0.5, "updated_at": 0.5},
    }
    op = _rows.reader(OpRecord)(row)
    assert op == OpRecord(
        "o", "t", 2, 0, "x", {"a": 1}, "h", "write", "done", 1, None,
        {"summary": "ab", "content": "abc"}, None, 1, 0.5, 0.5,
    )  # fmt: skip
    event = {"task_id": "t", "seq": 1, "type": "task.cancel_requested", "data": "{}"}
    got = _rows.reader(StoredEvent)({**event, "schema_version": 1, "task_version": 1,
                                     "fencing_token": None, "at": 0.0})  # fmt: skip
    assert got.data == rules.expand("task.cancel_requested", {})
