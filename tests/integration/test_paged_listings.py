"""Where people read a long ledger's items — `tether status` and the dashboard's task
page — they get a page of them, with the way to the next one."""

from __future__ import annotations

import io
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from rich.console import Console

from tests.support.loop import spec_of
from tether.cli import views
from tether.runtime.tasks import create_task, status_dict
from tether.store.memory import MemoryStore
from tether.web import create_app
from tether.web.security import COOKIE

TOKEN = "test-token-0123456789"
ROW = re.compile(r'data-item="([^"]+)"')


@pytest.fixture
async def long_task(tmp_path: Path) -> AsyncIterator[tuple[MemoryStore, str]]:
    store = await MemoryStore.open()
    task = await create_task(store, spec_of(120), workspace=tmp_path)
    yield store, task.task_id


def _text(renderable: object) -> str:
    console = Console(file=io.StringIO(), width=160, color_system=None)
    console.print(renderable)
    out = console.file
    assert isinstance(out, io.StringIO)
    return out.getvalue()


async def test_status_lists_a_long_ledger_a_page_at_a_time(
    long_task: tuple[MemoryStore, str],
) -> None:
    store, tid = long_task
    doc = await status_dict(store, tid)
    first = _text(views.status_view(doc))
    assert re.search(r"\bi50\b", first) and not re.search(r"\bi51\b", first)
    assert f"items 1-50 of 120; next page: tether status {tid} --after i50" in first
    second = _text(views.status_view(doc, after="i50"))
    assert re.search(r"\bi51\b", second) and re.search(r"\bi100\b", second)
    assert not re.search(r"\bi50\b", second) and not re.search(r"\bi101\b", second)
    last = _text(views.status_view(doc, after="i100"))
    assert "items 101-120 of 120" in last and "next page" not in last
    # A short ledger is listed whole, as before.
    assert "items 1-" not in _text(views.status_view(doc, limit=500))


def test_the_task_page_lists_a_page_of_items_with_a_link_to_the_next(
    long_task: tuple[MemoryStore, str],
) -> None:
    store, tid = long_task
    app = create_app(None, token=TOKEN, store=store)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        client.cookies.update({COOKIE: TOKEN})
        page = client.get(f"/tasks/{tid}")
        assert page.status_code == 200
        assert ROW.findall(page.text) == [f"i{k}" for k in range(1, 51)]
        assert "items 1&ndash;50 of 120" in page.text
        assert f'href="/tasks/{tid}?items_after=i50"' in page.text
        nxt = client.get(f"/tasks/{tid}?items_after=i50")
        assert ROW.findall(nxt.text) == [f"i{k}" for k in range(51, 101)]
        # The live part refreshes the same page.
        assert "/partials/state?items_after=i50" in nxt.text
        state = client.get(f"/tasks/{tid}/partials/state?items_after=i100")
        assert ROW.findall(state.text) == [f"i{k}" for k in range(101, 121)]
        assert "next page" not in state.text
