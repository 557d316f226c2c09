"""A ledger's items one row each (schema 7), for the SQL stores.

`ledgers` holds a task's ledger version, `ledger_skeletons` its skeleton (written at
creation and by a contract edit only), and `ledger_items` each item's state: its place
in the contract (`position`), its `status`, its state as JSON (`body`) and the ledger
version that last wrote it. A ledger write sends every item (or, from a runtime that
knows the stored ledger, only the items that changed: `LedgerWrite.positions`) and the
database rewrites only the rows whose state (or place) changed, so a commit that moves
one item of ten thousand writes one row, not the whole ledger; a write with a new
skeleton (a contract edit) also drops the rows of items the contract no longer has.
`get_ledger` reads the state back as one JSON object the database joins from the rows
(keyed by item id, as `Ledger.from_parts` reads it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tether.ledger import Ledger
    from tether.store.base import LedgerWrite

#: `execute(conn, query, params)`: a store's statement runner (`SqlStore._x`).
Execute = Callable[[Any, str, Mapping[str, Any]], Any]
#: The JSON encoder of a store's dialect.
Dumps = Callable[[Any], str]

#: The rows changed by an upsert: a state or place that differs (`{ne}`: the dialect's
#: null-safe "differs").
_UPDATE = (
    " ON CONFLICT (task_id, item_id) DO UPDATE SET position = excluded.position,"
    " status = excluded.status, body = excluded.body, version = excluded.version"
    " WHERE ledger_items.body {ne} excluded.body"
    " OR ledger_items.position {ne} excluded.position"
)

#: Upsert the items of `:litems` (`rows`) for task `:id` at ledger version `:v`.
SQLITE_UPSERT = (
    "INSERT INTO ledger_items (task_id, item_id, position, status, body, version)"
    " SELECT :id, json_extract(r.value, '$.id'), json_extract(r.value, '$.pos'),"
    " json_extract(r.value, '$.body.status'), json_extract(r.value, '$.body'), :v"
    " FROM json_each(:litems) r WHERE TRUE" + _UPDATE.format(ne="IS NOT")
)
#: Delete the rows of task `:id` whose item is not in `:litems`.
SQLITE_PRUNE = (
    "DELETE FROM ledger_items WHERE task_id = :id AND item_id NOT IN"
    " (SELECT json_extract(value, '$.id') FROM json_each(:litems))"
)
POSTGRES_PRUNE = (
    "DELETE FROM ledger_items WHERE task_id = :id AND item_id NOT IN"
    " (SELECT r.id FROM jsonb_to_recordset(:litems::jsonb) AS r(id text))"
)
#: The state of ledger `l` as one JSON object (item id -> state, in no set order; NULL
#: without items), joined from the bodies as stored (each one valid JSON: no parsing).
SQLITE_STATE = (
    "(SELECT '{' || group_concat(json_quote(i.item_id) || ':' || i.body, ',') || '}'"
    " FROM ledger_items i WHERE i.task_id = l.task_id)"
)
POSTGRES_STATE = (
    "(SELECT json_object_agg(i.item_id, i.body) FROM ledger_items i WHERE i.task_id = l.task_id)"
)


def postgres_upsert(task: str = ":id", version: str = ":v", source: str = "") -> str:
    """Upsert the items of `:litems` (`rows`) for the task `task` at ledger version
    `version` (SQL expressions), joined to `source` (a CTE's name and a comma, or "")."""
    return (
        "INSERT INTO ledger_items (task_id, item_id, position, status, body, version)"
        f" SELECT {task}, r.id, r.pos, r.body ->> 'status', r.body, {version}"
        f" FROM {source} jsonb_to_recordset(:litems::jsonb) AS r(id text, pos int, body jsonb)"
        + _UPDATE.format(ne="IS DISTINCT FROM")
    )


def rows(state: Mapping[str, Any], dumps: Dumps, positions: Sequence[int] | None = None) -> str:
    """A ledger state (item id -> item state, in contract order, or at `positions`) as
    the JSON array of rows the upserts read: `{"id", "pos", "body"}`."""
    places = range(len(state)) if positions is None else positions
    return dumps(
        [{"id": k, "pos": n, "body": v} for n, (k, v) in zip(places, state.items(), strict=True)]
    )


#: Per dialect: the upsert, the prune and the state of ledger `l` (`SqlStore.dialect`).
SQL = {
    "sqlite": (SQLITE_UPSERT, SQLITE_PRUNE, SQLITE_STATE),
    "postgres": (postgres_upsert(), POSTGRES_PRUNE, POSTGRES_STATE),
}


def select(dialect: str) -> str:
    """The query of task `:id`'s ledger: task_id, skeleton, state, version, updated_at."""
    return (
        f"SELECT l.task_id, k.skeleton, {SQL[dialect][2]} AS state, l.version, l.updated_at"
        " FROM ledgers l JOIN ledger_skeletons k ON k.task_id = l.task_id"
        " WHERE l.task_id = :id"
    )


def create(
    x: Execute, conn: Any, dialect: str, dumps: Dumps, task_id: str, ledger: Ledger, now: float
) -> None:
    """Write a new task's ledger: its version, its skeleton and its items."""
    x(
        conn,
        "INSERT INTO ledgers (task_id, version, updated_at) VALUES (:id, :v, :now)",
        {"id": task_id, "v": ledger.version, "now": now},
    )
    x(
        conn,
        "INSERT INTO ledger_skeletons (task_id, skeleton) VALUES (:id, :sk)",
        {"id": task_id, "sk": dumps(ledger.skeleton.to_dict())},
    )
    params = {"id": task_id, "v": ledger.version, "litems": rows(ledger.state_dict(), dumps)}
    x(conn, SQL[dialect][0], params)


def write(
    x: Execute, conn: Any, dialect: str, dumps: Dumps, task_id: str, ledger: LedgerWrite
) -> None:
    """After the ledger's version was moved (its condition held): the new skeleton if
    any, then the items that changed (a new skeleton may drop items: their rows go)."""
    litems = rows(ledger.state, dumps, ledger.positions)
    params = {"id": task_id, "v": ledger.version, "litems": litems}
    if ledger.skeleton is not None:
        x(
            conn,
            "UPDATE ledger_skeletons SET skeleton = :sk WHERE task_id = :id",
            {"id": task_id, "sk": dumps(ledger.skeleton)},
        )
        x(conn, SQL[dialect][1], params)
    x(conn, SQL[dialect][0], params)


def postgres_params(ledger: LedgerWrite, params: dict[str, Any], dumps: Dumps) -> int:
    """The parameters of PostgreSQL's one-statement commit that write the ledger's
    items (and skeleton, if given): 2 with a skeleton, else 1 (`postgres_text`)."""
    params["litems"] = rows(ledger.state, dumps, ledger.positions)
    if ledger.skeleton is None:
        return 1
    params["lsk"] = dumps(ledger.skeleton)
    return 2


def postgres_text(skeleton: bool) -> list[str]:
    """The CTEs of PostgreSQL's one-statement commit that write the ledger's skeleton
    (if given) and changed items, only if `led` (the ledger's version, moved under its
    condition) wrote its row."""
    ctes = [f"li AS ({postgres_upsert('led.task_id', ':lv', 'led,')})"]
    if skeleton:
        ctes.append(
            "lk AS (UPDATE ledger_skeletons k SET skeleton = :lsk::jsonb FROM led"
            " WHERE k.task_id = led.task_id)"
        )
        ctes.append(f"lp AS ({POSTGRES_PRUNE} AND EXISTS (SELECT FROM led))")
    return ctes
