"""A task's progress marks one row each (schema 8), for the SQL stores.

The run state (`usage`) holds, per open item, the fingerprints of what its rounds did
(`seen`: item -> marks, oldest first, up to a thousand each). Kept in the task row, that
list was rewritten by every commit, and on PostgreSQL each commit left a row version
(TOAST chunks) as big as the list behind it. Now the task row keeps `seen` as a stub
(item -> how many marks), and `task_marks` holds the marks, `(task_id, item_id, n,
mark)` with `n` rising per item: a commit adds the round's new marks and removes only
the marks it drops (`MarksWrite`), in its own transaction; `get_task` and `list_tasks`
read them back into `usage["seen"]`. A commit whose `usage` comes without a
`MarksWrite` (a writer that loaded the task, not a run) rewrites the task's marks whole.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tether.store.base import TaskPatch

#: `execute(conn, query, params)`: a store's statement runner (`SqlStore._x`).
Execute = Callable[[Any, str, Mapping[str, Any]], Any]
#: The JSON encoder of a store's dialect.
Dumps = Callable[[Any], str]

#: Per dialect: the marks of task `t` as a JSON array of `[item, n, mark]` (a column of
#: the task's query; NULL or `[]` without marks).
SELECT = {
    "sqlite": "(SELECT json_group_array(json_array(m.item_id, m.n, m.mark))"
    " FROM task_marks m WHERE m.task_id = t.task_id) AS marks",
    "postgres": "(SELECT json_agg(json_build_array(m.item_id, m.n, m.mark))"
    " FROM task_marks m WHERE m.task_id = t.task_id) AS marks",
}
#: Per dialect: append the marks of `:marks` (`[{"item", "marks"}]`) to task `:id`'s
#: items, each numbered after the item's last.
ADD = {
    "sqlite": "INSERT INTO task_marks (task_id, item_id, n, mark) SELECT :id, r.item,"
    " COALESCE((SELECT MAX(x.n) FROM task_marks x WHERE x.task_id = :id"
    " AND x.item_id = r.item), 0) + a.key + 1, a.value"
    " FROM (SELECT json_extract(value, '$.item') AS item, json_extract(value, '$.marks')"
    " AS marks FROM json_each(:marks)) r, json_each(r.marks) a",
    "postgres": "INSERT INTO task_marks (task_id, item_id, n, mark) SELECT :id, r.item,"
    " COALESCE((SELECT max(x.n) FROM task_marks x WHERE x.task_id = :id"
    " AND x.item_id = r.item), 0) + a.i, a.mark"
    " FROM jsonb_to_recordset(:marks::jsonb) AS r(item text, marks jsonb),"
    " jsonb_array_elements_text(r.marks) WITH ORDINALITY AS a(mark, i)",
}
#: Delete the `:k` oldest marks of task `:id`'s item `:item`.
_CUT = (
    "DELETE FROM task_marks WHERE task_id = :id AND item_id = :item AND n IN"
    " (SELECT n FROM task_marks WHERE task_id = :id AND item_id = :item ORDER BY n LIMIT :k)"
)


def stub(usage: Any) -> Any:
    """The run state as the task row keeps it: `seen` as item -> how many marks."""
    seen = usage.get("seen") if isinstance(usage, dict) else None
    if not isinstance(seen, dict):
        return usage
    return {**usage, "seen": {k: len(v) if isinstance(v, list) else 0 for k, v in seen.items()}}


def with_seen(usage: dict[str, Any], rows: Any) -> dict[str, Any]:
    """The run state as stored (`stub`) with its marks read back (`[item, n, mark]`
    rows, in any order) as `seen`: item -> marks, oldest first."""
    held = usage.get("seen")
    if not rows and not isinstance(held, dict):
        return usage
    by_item: dict[str, list[tuple[int, str]]] = {}
    for item, n, mark in rows or ():
        by_item.setdefault(item, []).append((int(n), mark))
    seen: dict[str, list[str]] = {k: [] for k in held} if isinstance(held, dict) else {}
    for item, marks in by_item.items():
        marks.sort()
        seen[item] = [m for _, m in marks]
    return {**usage, "seen": seen}


def plan(task: TaskPatch | None) -> tuple[bool, dict[str, int], list[dict[str, Any]]] | None:
    """What a commit does to the marks: None (nothing), else `(whole, cuts, adds)`: drop
    every mark of the task first (`whole`), then per item its oldest `k` marks (`k` < 0:
    all), then append `{"item", "marks"}`."""
    if task is None or task.usage is None:
        return None
    if task.marks is None:
        seen = task.usage.get("seen")
        lists = seen.items() if isinstance(seen, dict) else ()
        adds = [{"item": k, "marks": v} for k, v in lists if isinstance(v, list) and v]
        return True, {}, adds
    cuts = {k: -1 if cut is None else cut for k, (cut, _) in task.marks.items.items() if cut != 0}
    adds = [{"item": k, "marks": list(add)} for k, (_, add) in task.marks.items.items() if add]
    return (False, cuts, adds) if cuts or adds else None


def write(
    x: Execute, conn: Any, dialect: str, dumps: Dumps, task_id: str, task: TaskPatch | None
) -> None:
    """Apply a commit's marks (`plan`) inside its transaction, one statement each."""
    planned = plan(task)
    if planned is None:
        return
    whole, cuts, adds = planned
    if whole:
        x(conn, "DELETE FROM task_marks WHERE task_id = :id", {"id": task_id})
    for item, k in cuts.items():
        if k < 0:
            x(conn, "DELETE FROM task_marks WHERE task_id = :id AND item_id = :item",
              {"id": task_id, "item": item})  # fmt: skip
        else:
            x(conn, _CUT, {"id": task_id, "item": item, "k": k})
    if adds:
        x(conn, ADD[dialect], {"id": task_id, "marks": dumps(adds)})


#: What a commit's marks CTEs are (`postgres_text`): `(whole, cuts, adds)`, each a CTE.
Shape = tuple[bool, bool, bool]


def postgres_params(task: TaskPatch | None, params: dict[str, Any], dumps: Dumps) -> Shape | None:
    """The parameters of PostgreSQL's one-statement commit that apply its marks
    (`plan`), and the shape of the CTEs that take them (None: no marks written)."""
    planned = plan(task)
    if planned is None:
        return None
    whole, cuts, adds = planned
    if cuts:
        params["mkc"] = dumps([{"item": k, "k": v} for k, v in cuts.items()])
    if adds:
        params["mka"] = dumps(adds)
    return whole, bool(cuts), bool(adds)


#: The marks' cut: per item, its `k` oldest marks (all if `k` < 0 or the item has
#: fewer), found once per item (`mkn`) before the DELETE. A subquery correlated with
#: the deleted row ran once per mark of the item, at every commit once the item reached
#: the cap: a thousand index scans, 2-13 ms of the server's time a commit, more as dead
#: rows pile up. MATERIALIZED: inlined, the subquery would be back in the DELETE's join.
_MARK_CUTS = (
    "mkn AS MATERIALIZED (SELECT x.ctid AS t FROM go, jsonb_to_recordset(:mkc::jsonb)"
    " AS r(item text, k int), LATERAL (SELECT y.ctid FROM task_marks y"
    " WHERE y.task_id = go.task_id AND y.item_id = r.item ORDER BY y.n"
    " LIMIT CASE WHEN r.k >= 0 THEN r.k END) x),\n"
    "mkc AS (DELETE FROM task_marks m USING go WHERE m.task_id = go.task_id"
    " AND m.ctid = ANY (ARRAY(SELECT t FROM mkn)))"
)
#: The marks' additions, numbered after the item's last mark, found once per item
#: (`l`), not once per mark: the planner costs a per-mark subquery for the 100 x 100
#: rows it guesses two JSON functions make, near `jit_above_cost` (JIT would compile
#: the statement, milliseconds, at every commit once past it).
_MARK_ADDS = (
    "mka AS (INSERT INTO task_marks (task_id, item_id, n, mark) SELECT go.task_id,"
    " r.item, l.top + a.i, a.mark FROM go, jsonb_to_recordset(:mka::jsonb)"
    " AS r(item text, marks jsonb), LATERAL (SELECT COALESCE(max(x.n), 0) AS top"
    " FROM task_marks x WHERE x.task_id = go.task_id AND x.item_id = r.item) l,"
    " jsonb_array_elements_text(r.marks) WITH ORDINALITY AS a(mark, i))"
)


def postgres_text(shape: Shape | None) -> list[str]:
    """The CTEs of PostgreSQL's one-statement commit that apply its marks
    (`postgres_params`), only if `go` (the task row, its condition held) has its row.
    Every CTE sees the marks as they were before the statement: the new ones are
    numbered after the old ones, so those a CTE removes never collide with those
    another adds."""
    if shape is None:
        return []
    whole, cuts, adds = shape
    ctes = []
    if whole:
        ctes.append("mkw AS (DELETE FROM task_marks m USING go WHERE m.task_id = go.task_id)")
    if cuts:
        ctes.append(_MARK_CUTS)
    if adds:
        ctes.append(_MARK_ADDS)
    return ctes
