"""PostgreSQL's events, one row per commit (schema 11, `event_batches`).

A row holds a commit's events: their common fields once (task, task version, fencing
token, time) and `events`, a JSON array of `[type, schema_version, data]`, numbered up
to the row's `last_seq`. Writing is one row per commit (`batch_json` makes its array);
reading unnests the rows that hold events after a number (`events_query`), found by the
key `(task_id, last_seq)`, in the order of that key and of each array.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tether.store import _rules as rules

if TYPE_CHECKING:
    from tether import events as ev

#: The first schema with `event_batches` (before it: a row of `events` per event).
BATCHED_SCHEMA = 11

#: A commit's events as one row (the `:events` array's last event numbered `:last`).
INSERT = (
    "INSERT INTO event_batches (last_seq, at, fencing_token, task_version, task_id, events)"
    " VALUES (:last, :at, :fencing_token, :task_version, :task_id, :events::json)"
)

#: Task `:id`'s events after `:after`, with the commit row's key and the event's place
#: in it (`batch_seq`, `batch_n`) to order by: only the rows whose last event is after
#: `:after` are read, by the key's index.
_UNNESTED = (
    "SELECT b.task_id, b.last_seq - c.k + e.n AS seq, e.v ->> 0 AS type,"
    " (e.v ->> 1)::int AS schema_version, e.v -> 2 AS data, b.task_version,"
    " b.fencing_token, b.at, b.last_seq AS batch_seq, e.n AS batch_n"
    " FROM event_batches b, json_array_length(b.events) AS c(k),"
    " json_array_elements(b.events) WITH ORDINALITY AS e(v, n)"
    " WHERE b.task_id = :id AND b.last_seq > :after"
)


def events_query(cols: str, where: str, lim: str) -> str:
    """One SELECT of `cols`: task `:id`'s events after `:after` and `where`, in order."""
    return (
        f"SELECT {cols} FROM ({_UNNESTED}) e WHERE seq > :after{where}"
        f" ORDER BY batch_seq, batch_n{lim}"
    )


def batch_json(items: Sequence[ev.Event], dumps: Callable[[Any], str]) -> str:
    """The `events` array of a commit's events (their data compacted, `_rules.compact`)."""
    from tether import events as ev

    out = []
    for event in items:
        name, schema, data = ev.encode(event)
        out.append([name, schema, rules.compact(name, data)])
    return dumps(out)


def batch_row(rows: Sequence[Mapping[str, Any]], dumps: Callable[[Any], str]) -> dict[str, Any]:
    """The parameters of `INSERT` for a commit's event rows (as `SqlStore._add_events`
    gets them: by column, `data` as JSON text, in `seq` order, one version, token and
    time)."""
    first = rows[0]
    array = ",".join(f"[{dumps(r['type'])},{int(r['schema_version'])},{r['data']}]" for r in rows)
    return {
        "last": int(rows[-1]["seq"]),
        "at": first["at"],
        "fencing_token": first["fencing_token"],
        "task_version": first["task_version"],
        "task_id": first["task_id"],
        "events": f"[{array}]",
    }
