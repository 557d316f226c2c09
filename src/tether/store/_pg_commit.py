"""PostgreSQL's one-statement commit (`PostgresStore._commit_sync`): its parameters and
its text.

The statement's text depends only on the commit's shape: which conditions it checks,
which task columns it sets, whether it writes events, the ledger (and its skeleton),
marks, which record tables, search texts, blobs. A worker's commits come in a handful
of shapes, so each shape's text is built and translated to psycopg's placeholders once
(`_text`); a commit only builds its parameters. The same text each time is also what
lets psycopg prepare the statement on the server.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tether import events as ev
from tether.store import _ledger_rows as ledger_rows
from tether.store import _marks as marks
from tether.store import _pg_events as pg_events
from tether.store import _rules as rules
from tether.store import _search as search
from tether.store._rows import data_no_nul, flat, record_json
from tether.store._rows import dumps_no_nul as _dumps
from tether.store._sql import RECORD_TABLES, _upsert
from tether.store.base import OpRecord

if TYPE_CHECKING:
    from tether.store.base import Commit

_PLACEHOLDER = re.compile(r"(?<![:\w]):(\w+)")


@functools.lru_cache(maxsize=1024)
def placeholders(query: str) -> str:
    """`:name` -> `%(name)s` (casts `::type` left alone)."""
    return _PLACEHOLDER.sub(r"%(\1)s", query)


#: `jsonb_to_recordset` column lists: the record fields as SQL types.
_OP_RECORD = (
    "op_id text, task_id text, round int, call_index int, tool text, args jsonb,"
    " args_hash text, effect text, status text, attempts int, next_attempt_at float8,"
    " result jsonb, error jsonb, task_version int, created_at float8, updated_at float8"
)
_ARTIFACT_RECORD = (
    "artifact_id text, task_id text, kind text, name text, blob_hash text, size bigint,"
    " source text, task_version int, deps jsonb, valid boolean, meta jsonb, created_at float8"
)
_APPROVAL_RECORD = (
    "request_id text, task_id text, op_id text, status text, request jsonb, decision jsonb,"
    " decided_by text, created_at float8, decided_at float8"
)
#: The JSON records of each table a commit upserts.
_RECORDS = {"ops": _OP_RECORD, "artifacts": _ARTIFACT_RECORD, "approvals": _APPROVAL_RECORD}
#: Since schema 12 an op's result is a row of `op_results` (see `op_rows`): the op's
#: own row, and the outcome columns a later write of it may change, without it.
_OP_RECORD_12 = _OP_RECORD.replace(" result jsonb,", "")
_OP_MUTABLE_12 = tuple(c for c in RECORD_TABLES["ops"][1] if c != "result")
#: The first schema with `op_results` (before it: the result in the op's row).
OP_RESULTS_SCHEMA = 12
#: The ops' upsert of the commits that do not fit one statement (`_commit_requests`
#: without a pipeline), and their results' writes.
OPS_UPSERT = _upsert(
    "ops", ", ".join(p.split()[0] for p in _OP_RECORD_12.split(",")), "op_id", _OP_MUTABLE_12
)
RESULT_UPSERT = (
    "INSERT INTO op_results (op_id, result) VALUES (:op_id, :result::jsonb)"
    " ON CONFLICT (op_id) DO UPDATE SET result = excluded.result"
    " WHERE op_results.result IS DISTINCT FROM excluded.result"
)
RESULT_DELETE = "DELETE FROM op_results WHERE op_id = :op_id"
#: Where `get_ops` reads ops from: an op's result is the row of `op_results` with its id.
OPS_JOINED = "ops LEFT JOIN op_results USING (op_id)"


def write_ops(xmany: Callable[[str, list[dict[str, Any]]], None], rows: list[Any]) -> None:
    """Write ops by `xmany(query, rows)` (executemany), schema 12's way: the commits that
    do not fit one statement. `rows`: `SqlStore._params` of each (the result as stored,
    JSON text)."""
    results = [{"op_id": r["op_id"], "result": r.pop("result")} for r in rows]
    xmany(OPS_UPSERT, rows)
    xmany(RESULT_UPSERT, [r for r in results if r["result"] is not None])
    xmany(RESULT_DELETE, [r for r in results if r["result"] is None])


#: Write the results of `:opr` (`[{"op_id", "result"}]`) once each: a result written
#: again unchanged (a later write of the op) leaves its row as it is, no new version.
_RESULTS_WRITE = (
    "opr_w AS (INSERT INTO op_results (op_id, result) SELECT r.op_id, r.result FROM go,"
    " jsonb_to_recordset(:opr::jsonb) AS r(op_id text, result jsonb) ON CONFLICT (op_id)"
    " DO UPDATE SET result = excluded.result"
    " WHERE op_results.result IS DISTINCT FROM excluded.result)"
)
#: Drop the results of the ops `:opn` (a JSON array of ids) that were written without
#: one: the op's record has none (a result, if stored before, is cleared with it).
_RESULTS_CLEAR = (
    "opr_d AS (DELETE FROM op_results d USING go"
    " WHERE d.op_id IN (SELECT jsonb_array_elements_text(:opn::jsonb)))"
)
#: `_text`'s `results` bits: ops written without their result (schema 12), some with
#: one, some without.
SPLIT, KEPT, CLEARED = 1, 2, 4


def op_rows(records: Sequence[OpRecord], dumps: Callable[[Any], str]) -> tuple[str, str, str]:
    """Ops as schema 12 writes them, as JSON arrays: their rows without the result (as
    `record_json`), the `op_results` rows (`op_id`, the result as stored,
    `_rules.op_result_stored`) of those that have one, the ids of those that have none
    (`[]` when there are none of a kind)."""
    try:
        return _op_rows([dict(vars(r)) for r in records], dumps)
    except TypeError:  # a value that is a dataclass: JSON cannot hold it (`record_json`)
        return _op_rows([dataclasses.asdict(r) for r in records], dumps)


def _op_rows(rows: list[dict[str, Any]], dumps: Callable[[Any], str]) -> tuple[str, str, str]:
    kept, cleared = [], []
    for row in rows:
        result = row.pop("result")
        if result is None:
            cleared.append(row["op_id"])
        else:
            kept.append({"op_id": row["op_id"], "result": rules.op_result_stored(result)})
    return (
        _json(rows, dumps),
        _json(kept, dumps) if kept else "",
        (dumps(cleared) if cleared else ""),
    )


def _json(rows: list[dict[str, Any]], dumps: Callable[[Any], str]) -> str:
    """`dumps(rows)`; rows of plain values (arguments, results and errors flat dicts, as
    tools' outputs are rendered) are JSON data, written by pydantic's encoder when
    `dumps` is the store's (`_rows.data_dumps`: the same text)."""
    if dumps is _dumps and all(flat(r, nested=True) for r in rows):
        return data_no_nul(rows)
    return dumps(rows)


def _recordset_upsert(table: str, record: str, key: str, mutable: Sequence[str]) -> str:
    """A CTE upserting the JSON array parameter `:table` (rows shaped as `record`),
    written only if the commit's condition held (`go` has its row)."""
    cols = ", ".join(part.split()[0] for part in record.split(","))
    picked = ", ".join(f"r.{c}" for c in cols.split(", "))
    sets = ", ".join(f"{c} = excluded.{c}" for c in mutable)
    return (
        f"{table}_w AS (INSERT INTO {table} ({cols}) SELECT {picked} FROM go,"
        f" jsonb_to_recordset(:{table}::jsonb) AS r({record})"
        f" ON CONFLICT ({key}) DO UPDATE SET {sets})"
    )


#: Commit cursors a connection keeps, one per statement shape (`cursor`).
CURSORS_KEPT = 16


def cursor(conn: Any, query: bytes, row_factory: Any) -> Any:
    """`conn`'s cursor for the commits of `query`'s shape, made once per connection and
    shape: psycopg keeps a cursor's dumpers of the parameters while it runs the same
    query object again, and a worker's commits alternate between a few shapes (10 us a
    round less than a new cursor per commit). A pooled connection, hence its cursors,
    serves one thread at a time."""
    cursors = getattr(conn, "_tether_cursors", None)
    if cursors is None:
        cursors = conn._tether_cursors = {}
    cur = cursors.get(query)
    if cur is None or cur.closed:
        if len(cursors) >= CURSORS_KEPT:
            cursors.clear()
        cur = cursors[query] = conn.cursor(row_factory=row_factory)
    return cur


#: The row the statement returns, by position (the store reads it so; see `_text`).
STATUS, VERSION, FENCING_TOKEN, LAST_SEQ, CANCEL_REQUESTED, LEDGER_VERSION, APPLIED = range(7)


def statement(
    cond: rules.CommitCondition,
    c: Commit,
    now: float,
    texts: Sequence[Mapping[str, Any]],
    encode: Callable[[Mapping[str, Any]], dict[str, Any]],
    *,
    batched: bool = True,
    op_results: bool = True,
) -> tuple[bytes, dict[str, Any]]:
    """The commit's statement text and parameters (`encode`: the store's encoding of
    task column values; `batched`: the events as one row, schema 11; `op_results`: the
    ops' results in rows of their own, schema 12). The text is bytes,
    the same object for each shape: psycopg encodes a `str` query at every call and
    hashes it to find its parsed form."""
    task, ledger, items, blobs = c.task, c.ledger, c.events, c.blobs
    params: dict[str, Any] = {"id": cond.task_id, "now": now, "tok": cond.token}
    sources = cond.sources
    if sources is not None:
        params["src"] = _array(sources)
    if cond.version is not None:
        params["ver"] = cond.version
    led = 0
    if ledger is not None:
        params["lv"] = ledger.version
        params["lev"] = ledger.expected_version
        led = ledger_rows.postgres_params(ledger, params, _dumps)
    cols = []
    for col, value in encode(rules.task_changes(task, cond.token, now)).items():
        params["spec" if col == "spec" else f"c_{col}"] = value
        cols.append(col)
    if items:
        params["n"] = len(items)
        params["events"] = (
            pg_events.batch_json(items, data_no_nul) if batched else _dumps(_event_rows(items))
        )
    mk = marks.postgres_params(task, params, _dumps)
    tables = []
    results = 0
    for table, records in rules.record_writes(c, now):
        tables.append(table)
        if table == "ops" and op_results:
            params[table], kept, cleared = op_rows(records, _dumps)
            results = SPLIT
            if kept:
                params["opr"] = kept
                results |= KEPT
            if cleared:
                params["opn"] = cleared
                results |= CLEARED
            continue
        params[table] = record_json(records, _dumps)
    if texts:
        params["texts"] = _dumps(list(texts))
        params["tcap"] = search.MAX_INDEXED_BYTES
        params["tchars"] = search.MAX_INDEXED_CHARS
    if blobs:
        unique = rules.unique_blobs(blobs)
        params["bh"] = list(unique)
        params["bd"] = list(unique.values())
    shape = (
        cond.token is not None,
        sources is not None,
        cond.version is not None,
        led,
        tuple(cols),
        (2 if batched else 1) if items else 0,
        mk,
        tuple(tables),
        results,
        bool(texts),
        bool(blobs),
    )
    return _text(*shape), params


@functools.lru_cache(maxsize=256)
def _array(statuses: frozenset[str]) -> str:
    """Statuses as an array literal the statement casts (`::text[]`): a list parameter
    is adapted by psycopg anew at every call."""
    return "{" + ",".join(f'"{s}"' for s in sorted(statuses)) + "}"


def _event_rows(items: Sequence[ev.Event]) -> list[dict[str, Any]]:
    rows = []
    for n, event in enumerate(items, 1):
        name, schema, data = ev.encode(event)
        rows.append({"n": n, "type": name, "sv": schema, "data": rules.compact(name, data)})
    return rows


@functools.lru_cache(maxsize=512)
def _text(
    fenced: bool,
    moves: bool,
    versioned: bool,
    led: int,
    cols: tuple[str, ...],
    has_events: int,
    mk: marks.Shape | None,
    tables: tuple[str, ...],
    results: int,
    has_texts: bool,
    has_blobs: bool,
) -> bytes:
    """The statement of a commit of this shape (see `statement`; `has_events`: 0 none,
    1 a row each, 2 one row, `_pg_events`; `results`: `SPLIT`, `KEPT`, `CLEARED`),
    translated (ASCII: the same bytes in any client encoding)."""
    conds = []
    if fenced:
        conds.append("fencing_token = :tok")
    if moves:
        conds.append("status = ANY(:src::text[])")
    if versioned:
        conds.append("version <= :ver")
    ctes = [
        "cur AS MATERIALIZED (SELECT task_id, status, version, fencing_token, last_seq,"
        " cancel_requested"
        " FROM tasks WHERE task_id = :id FOR UPDATE)",
        f"ok AS (SELECT * FROM cur WHERE {' AND '.join(conds) or 'TRUE'})",
    ]
    final = "SELECT c.status, c.version, c.fencing_token, c.last_seq, c.cancel_requested,"
    if led:
        ctes.append(
            "led AS (UPDATE ledgers l SET version = :lv, updated_at = :now FROM ok"
            " WHERE l.task_id = ok.task_id AND l.version = :lev RETURNING l.task_id)"
        )
        ctes.append("go AS MATERIALIZED (SELECT ok.* FROM ok JOIN led USING (task_id))")
        ctes.extend(ledger_rows.postgres_text(skeleton=led == 2))
        final += " (SELECT version FROM ledgers WHERE task_id = :id) AS ledger_version,"
    else:
        ctes.append("go AS MATERIALIZED (SELECT * FROM ok)")
        final += " NULL AS ledger_version,"
    ctes.extend(_task_writes(cols, bool(has_events), mk))
    version = ":ver" if versioned else "go.version"
    if has_events == 2:
        ctes.append(
            "ev AS (INSERT INTO event_batches (last_seq, at, fencing_token, task_version,"
            f" task_id, events) SELECT go.last_seq + :n, :now, :tok::bigint, {version},"
            " go.task_id, :events::json FROM go)"
        )
    elif has_events:
        # json, not jsonb: each event's text is stored as written (schema 10).
        ctes.append(
            "ev AS (INSERT INTO events (task_id, seq, type, schema_version, data,"
            " task_version, fencing_token, at)"
            f" SELECT go.task_id, go.last_seq + r.n, r.type, r.sv, r.data, {version},"
            " :tok::bigint, :now FROM go, json_to_recordset(:events::json)"
            " AS r(n int, type text, sv int, data json))"
        )
    for table in tables:
        if table == "ops" and results & SPLIT:
            ctes.append(_recordset_upsert("ops", _OP_RECORD_12, "op_id", _OP_MUTABLE_12))
            if results & KEPT:
                ctes.append(_RESULTS_WRITE)
            if results & CLEARED:
                ctes.append(_RESULTS_CLEAR)
            continue
        ctes.append(_recordset_upsert(table, _RECORDS[table], *RECORD_TABLES[table]))
    if has_texts:
        # The search index of the new artifacts, in the same statement (an artifact
        # indexed already keeps its row: its blob, hence its text, never changes).
        # A stored blob read here is indexed as plain text (its name and text,
        # NUL-free UTF-8 only), without the JSON reading `indexed_text` does.
        ctes.append(
            "tx AS (INSERT INTO artifact_text (artifact_id, task_id, body)"
            " SELECT artifact_id, task_id, body FROM (SELECT r.artifact_id, r.task_id,"
            " COALESCE(r.body, left(concat_ws(E'\\n', NULLIF(r.name, ''),"
            " tether_blob_text((SELECT substr(b.data, 1, :tcap) FROM blobs b"
            " WHERE b.hash = r.blob_hash))), :tchars)) AS body FROM go,"
            " jsonb_to_recordset(:texts::jsonb) AS r(artifact_id text, task_id text,"
            " name text, blob_hash text, body text)) t WHERE body <> ''"
            " ON CONFLICT (artifact_id) DO NOTHING)"
        )
    if has_blobs:
        ctes.append(
            "bl AS (INSERT INTO blobs (hash, size, data, created_at)"
            " SELECT u.h, octet_length(u.d), u.d, :now FROM go,"
            " unnest(:bh::text[], :bd::bytea[]) AS u(h, d) ON CONFLICT (hash) DO NOTHING)"
        )
    final += " (SELECT count(*) FROM go) AS applied FROM cur c"
    return placeholders("WITH " + ",\n".join(ctes) + "\n" + final).encode("ascii")


def _task_writes(cols: tuple[str, ...], has_events: bool, mk: marks.Shape | None) -> list[str]:
    """The CTEs writing the task's row (and its contract, if edited: its own row
    since schema 6, so that the row each commit rewrites stays small)."""
    ctes = []
    sets = []
    for col in cols:
        if col == "spec":
            ctes.append(
                "sp AS (UPDATE task_specs s SET spec = :spec::jsonb FROM go"
                " WHERE s.task_id = go.task_id)"
            )
            continue
        cast = "::json" if col in rules.JSON_COLUMNS else ""  # json since schema 10
        sets.append(f"{col} = :c_{col}{cast}")
    if has_events:
        sets.append("last_seq = go.last_seq + :n")
    ctes.append(
        f"tu AS (UPDATE tasks t SET {', '.join(sets)} FROM go WHERE t.task_id = go.task_id)"
    )
    return ctes + marks.postgres_text(mk)
