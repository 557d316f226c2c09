"""Tools with real external effects, for the crash-window tests (`TETHER_TOOLS`).

- `create_ticket(title)`: `POST /tickets` on the ticket API at `$TICKETS_URL` with
  `Idempotency-Key: <op_id>`; `reconcile` looks the ticket up by that key. A dropped
  connection or a client timeout is an unknown outcome (the engine's default
  classification of `RemoteDisconnected` / `TimeoutError`), a 503 is transient (its
  `Retry-After` is honoured).
- `create_ticket_blind(title)`: the same call without an idempotency key and without
  `reconcile`, so an unknown outcome can only be settled by a human. It sends the op id
  as `X-Trace-Op`, which the service records but does not deduplicate on (for the
  tests' bookkeeping only).
- `insert_row(key, value)`: a plain `INSERT` into a PostgreSQL table whose unique
  column is the op id (`$ROWS_PG_URL`, tether's `?schema=` parameter understood, table
  `$ROWS_TABLE`, default `effects`); `reconcile` selects the row by op id. A second
  send would fail on the unique key, so it never passes silently.

`TETHER_TOOLS=tests.services.tools:TOOLS` registers them all.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from tether.tools.registry import Reconciliation, Tool, ToolContext, tool
from tether.tools.retry import RetryPolicy

TICKETS_URL_ENV = "TICKETS_URL"
TICKETS_TIMEOUT_ENV = "TICKETS_TIMEOUT"
ROWS_URL_ENV = "ROWS_PG_URL"
ROWS_TABLE_ENV = "ROWS_TABLE"

#: Quick retries in the worker; a service's Retry-After is honoured up to a minute.
RETRY = RetryPolicy(max_attempts=3, base_delay=0.05, max_delay=60.0)


@dataclass(frozen=True)
class _Response:
    status_code: int
    headers: Any


class HTTPStatusError(Exception):
    """A non-2xx answer; `status_code` and `response.headers` drive the classification."""

    def __init__(self, status: int, headers: Any, body: str) -> None:
        super().__init__(f"{status} {body[:200]}")
        self.status_code = status
        self.response = _Response(status, headers)


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"{name} is not set")
    return value


def _request(
    method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any, Any]:
    """One request on a fresh connection (no proxies, no keep-alive): status, headers,
    decoded JSON body."""
    url = urlsplit(_env(TICKETS_URL_ENV))
    timeout = float(os.environ.get(TICKETS_TIMEOUT_ENV, "3"))
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        raw = resp.read().decode()
        return resp.status, resp.headers, json.loads(raw) if raw else None
    finally:
        conn.close()


def _post_ticket(title: str, headers: dict[str, str]) -> dict[str, Any]:
    status, hdrs, doc = _request("POST", "/tickets", {"title": title}, headers)
    if status not in (200, 201):
        raise HTTPStatusError(status, hdrs, json.dumps(doc))
    return dict(doc)


def _has_id(result: Any) -> bool | str:
    if isinstance(result, dict) and isinstance(result.get("id"), int):
        return True
    return f"the ticket API answered without a ticket id: {result!r}"


async def _find_ticket(op: Any, ctx: ToolContext) -> Reconciliation:
    """Ask the ticket API whether a ticket with this op's key exists."""
    status, hdrs, doc = await asyncio.to_thread(_request, "GET", f"/tickets?key={op.op_id}")
    if status == 200:
        return Reconciliation("done", doc)
    if status == 404:
        return Reconciliation("not_done")
    raise HTTPStatusError(status, hdrs, json.dumps(doc))


def _create_ticket(title: str, ctx: ToolContext) -> dict[str, Any]:
    """File a ticket with this title in the ticket tracker."""
    return _post_ticket(title, {"Idempotency-Key": ctx.op_id, "X-Attempt": str(ctx.attempt)})


def _create_ticket_blind(title: str, ctx: ToolContext) -> dict[str, Any]:
    """File a ticket (no idempotency key, no way to look it up afterwards)."""
    return _post_ticket(title, {"X-Trace-Op": ctx.op_id, "X-Attempt": str(ctx.attempt)})


def ticket_tool(**extra: Any) -> Tool:
    """`create_ticket` as the tests declare it: service `tickets`, retried on `RETRY`,
    reconciled by its idempotency key; `extra`: more options (a tether timeout, a
    compensation)."""
    return tool(
        _create_ticket,
        name="create_ticket",
        effect="write",
        service="tickets",
        retry=RETRY,
        reconcile=_find_ticket,
        validate=_has_id,
        **extra,
    )


create_ticket: Tool = ticket_tool()
create_ticket_blind: Tool = tool(
    _create_ticket_blind,
    name="create_ticket_blind",
    effect="write",
    service="tickets",
    retry=RETRY,
    validate=_has_id,
)


# ---------------------------------------------------------------- PostgreSQL rows


def rows_connect(url: str) -> Any:
    """An autocommit psycopg connection; tether's `schema=` becomes the search_path."""
    import psycopg

    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = next((v for k, v in query if k == "schema"), None)
    rest = urlencode([(k, v) for k, v in query if k != "schema"])
    conn = psycopg.connect(urlunsplit(parts._replace(query=rest)), autocommit=True)
    if schema:
        conn.execute(f'SET search_path TO "{schema}"')
    return conn


def rows_table() -> str:
    """The table `insert_row` writes to."""
    name = os.environ.get(ROWS_TABLE_ENV, "effects")
    if not name.isidentifier():
        raise RuntimeError(f"{ROWS_TABLE_ENV}={name!r} is not a plain table name")
    return name


def create_rows_table(url: str) -> None:
    """Create the table (op id unique) if it is missing."""
    with rows_connect(url) as conn:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {rows_table()} (op_id TEXT PRIMARY KEY,"
            " key TEXT NOT NULL, value TEXT NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )


def _select_row(op_id: str) -> dict[str, Any] | None:
    with rows_connect(_env(ROWS_URL_ENV)) as conn:
        row = conn.execute(
            f"SELECT op_id, key, value FROM {rows_table()} WHERE op_id = %s", (op_id,)
        ).fetchone()
    return None if row is None else {"op_id": row[0], "key": row[1], "value": row[2]}


async def _find_row(op: Any, ctx: ToolContext) -> Reconciliation:
    """Ask the table whether this op's row exists."""
    row = await asyncio.to_thread(_select_row, op.op_id)
    return Reconciliation("not_done") if row is None else Reconciliation("done", row)


def _insert_row(key: str, value: str, ctx: ToolContext) -> dict[str, Any]:
    """Insert a row (key, value) into the results table."""
    with rows_connect(_env(ROWS_URL_ENV)) as conn:
        conn.execute(
            f"INSERT INTO {rows_table()} (op_id, key, value) VALUES (%s, %s, %s)",
            (ctx.op_id, key, value),
        )
    return {"op_id": ctx.op_id, "key": key, "value": value}


insert_row: Tool = tool(
    _insert_row, name="insert_row", effect="write", service="rows", retry=RETRY, reconcile=_find_row
)


TICKET_TOOLS: list[Tool] = [create_ticket, create_ticket_blind]
ROW_TOOLS: list[Tool] = [insert_row]
TOOLS: list[Tool] = [*TICKET_TOOLS, *ROW_TOOLS]
