"""`ledger_items`: the read-only built-in tool that pages through a long ledger.

A ledger of more than `ledger_view.FULL_VIEW_MAX_ITEMS` items reaches the model as a
view of bounded size; the model reads the rest a page at a time:
`ledger_items(status="blocked")`, `ledger_items(milestone="m2", after="f-0410", limit=50)`.
The tool reads the stored, audited ledger (never the conversation's copy) and changes
nothing. The engine offers it to every task whose ledger is shown as a view.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Literal

from pydantic import Field

from tether import errors, ledger_view
from tether.store.base import Store
from tether.tools.registry import Tool, ToolContext, tool

LEDGER_ITEMS = ledger_view.LEDGER_ITEMS_TOOL

StatusFilter = Literal["open", "pending", "in_progress", "done", "blocked", "skipped", "waived"]


def ledger_items_tool(store_getter: Callable[[], Store]) -> Tool:
    """`ledger_items(status=None, milestone=None, after=None, limit=50)`: one page of the
    task's ledger items in contract order."""

    @tool(
        name=LEDGER_ITEMS,
        effect="read",
        volatile=False,
        description=(
            "List the goal ledger's items, a page at a time, in checklist order: filter by "
            "status ('open' = pending or in progress) and milestone; pass the last id you "
            "saw as `after` for the next page."
        ),
    )
    async def ledger_items(
        ctx: ToolContext,
        status: StatusFilter | None = None,
        milestone: str | None = None,
        after: str | None = None,
        limit: Annotated[int, Field(ge=1, le=ledger_view.PAGE_MAX)] = 50,
    ) -> str:
        ledger = (await store_getter().get_ledger(ctx.task_id)).to_ledger()
        try:
            return ledger_view.page(
                ledger, status=status, milestone=milestone, after=after, limit=limit
            )
        except KeyError:
            raise errors.ToolFailed(f"{LEDGER_ITEMS}: no ledger item {after!r}") from None

    return ledger_items
