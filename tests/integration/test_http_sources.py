"""`url` and `api` sources, read with `read_source` from a real HTTP server on
127.0.0.1 started by the test: a snapshot is fetched once and served the same bytes
after; a fingerprint records the ETag and a changed one on re-read invalidates what
depended on the earlier read; an api source asks for JSON (GET, or a POST of the
contract's body); timeouts, size caps and HTTP errors fail the call clearly, and a
URL's credentials never reach the store. On every store."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tether import errors
from tether.runtime.tasks import create_task
from tether.spec import parse_spec
from tether.store.base import Store
from tether.tools.builtin import sources as st
from tether.tools.builtin.sources import source_tools
from tether.tools.registry import Tool, ToolContext

SECRET = "hunter2-very-secret"


@dataclass
class Page:
    body: bytes
    etag: str | None = None
    status: int = 200


@dataclass
class Site:
    """What the server serves (by path) and what it was asked."""

    pages: dict[str, Page] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    base: str = ""

    def hits(self, path: str) -> int:
        return sum(1 for r in self.requests if r["path"] == path)


@pytest.fixture
def site() -> Iterator[Site]:
    state = Site()

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            path = self.path.split("?", 1)[0]
            size = int(self.headers.get("content-length") or 0)
            state.requests.append(
                {
                    "path": path,
                    "method": self.command,
                    "accept": self.headers.get("accept"),
                    "auth": self.headers.get("authorization"),
                    "body": self.rfile.read(size) if size else b"",
                }
            )
            if path == "/slow":
                state.release.wait(30)  # until the test is over
            page = state.pages.get(path, Page(b"not found", status=404))
            self.send_response(page.status)
            if page.etag:
                self.send_header("ETag", page.etag)
            self.send_header("Last-Modified", "Tue, 01 Dec 2026 10:00:00 GMT")
            self.send_header("Content-Length", str(len(page.body)))
            self.end_headers()
            self.wfile.write(page.body)

        do_GET = do_POST = _serve

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    state.base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()


class Calls:
    def __init__(self, store: Store, task_id: str, token: int, ws: Path) -> None:
        self.store, self.task_id, self.token, self.ws = store, task_id, token, ws
        self.tools: dict[str, Tool] = {t.name: t for t in source_tools(lambda: store)}
        self.n = 0

    async def __call__(self, name: str, **args: Any) -> str:
        self.n += 1
        ctx = ToolContext(
            op_id=f"{self.task_id}.r{self.n}.c0",
            task_id=self.task_id,
            task_version=1,
            fencing_token=self.token,
            workspace=self.ws,
            logger=logging.getLogger("test"),
        )
        return str(await self.tools[name].fn(args, ctx))


@pytest.fixture
async def call(store: Store, tmp_path: Path, site: Site) -> Calls:
    b = site.base
    creds = b.replace("http://", f"http://reader:{SECRET}@")
    spec = parse_spec(
        {
            "objective": "o",
            "items": [{"id": "i", "title": "t"}],
            "sources": [
                {"id": "P", "kind": "url", "version": "1", "location": f"{creds}/page?x=1"},
                {
                    "id": "F",
                    "kind": "url",
                    "version": "1",
                    "location": f"{b}/feed?api_key={SECRET}",
                    "pin": "fingerprint",
                },
                {"id": "G", "kind": "api", "version": "v1", "location": f"{b}/prices"},
                {
                    "id": "Q",
                    "kind": "api",
                    "version": "v1",
                    "location": f"{b}/query",
                    "method": "POST",
                    "body": {"product": "B", "fields": ["price"]},
                },
                {"id": "MISSING", "kind": "url", "version": "1", "location": f"{b}/nope"},
                {"id": "SLOW", "kind": "url", "version": "1", "location": f"{b}/slow"},
            ],
        }
    )
    task = await create_task(store, spec, workspace=tmp_path)
    lease = await store.claim("w", 60, task_id=task.task_id)
    assert lease is not None
    return Calls(store, task.task_id, lease.token, tmp_path)


def _id(text: str, what: str) -> str:
    return text.split(what, 1)[1].split()[0]


async def _everything_stored(store: Store, task_id: str) -> str:
    arts = await store.get_artifacts(task_id)
    events = await store.read_events(task_id)
    return json.dumps([a.meta for a in arts]) + json.dumps([e.data for e in events])


async def test_a_url_snapshot_is_fetched_once_and_served_the_same_after(
    call: Calls, site: Site
) -> None:
    site.pages["/page"] = Page(b"B costs 35 euros.", etag='"v1"')
    first = await call("read_source", source="P")
    assert "B costs 35 euros." in first and "(url, snapshot)" in first
    snap = _id(first, "cite snapshot artifact ")
    site.pages["/page"] = Page(b"B costs 99 euros.", etag='"v2"')
    again = await call("read_source", source="P")
    assert "35 euros" in again and "99 euros" not in again
    assert _id(again, "cite snapshot artifact ") == snap
    assert site.hits("/page") == 1  # the snapshot serves; the server is not asked again
    ev = await call("record_evidence", source_artifact=snap, excerpt="B costs 35 euros")
    assert "evidence artifact" in ev
    # The credentials in the URL were sent (basic auth) but are stored nowhere.
    assert site.requests[0]["auth"] and site.requests[0]["auth"].startswith("Basic ")
    art = await call.store.get_artifact(snap)
    assert art.meta["url"].startswith("http://***@127.0.0.1") and art.meta["etag"] == '"v1"'
    assert SECRET not in await _everything_stored(call.store, call.task_id)


async def test_a_changed_etag_on_re_read_invalidates_what_depended_on_it(
    call: Calls, site: Site
) -> None:
    site.pages["/feed"] = Page(b"x,y\n1,2\n", etag='"a"')
    first = await call("read_source", source="F")
    fp = _id(first, "cite snapshot artifact ")
    meta = (await call.store.get_artifact(fp)).meta
    assert meta["etag"] == '"a"' and meta["last_modified"] and meta["sha256"]
    assert "api_key=***" in meta["url"] and SECRET not in meta["url"]
    ev = _id(await call("record_evidence", source_artifact=fp, excerpt="1,2"), "evidence artifact ")
    claim = _id(await call("record_claim", text="y is 2", evidence=[ev]), "claim artifact ")
    assert "NOTE" not in await call("read_source", source="F")  # same ETag: nothing happens
    # A fingerprint is checked at every read, and again when evidence quotes the read
    # (only the fingerprint is stored: the excerpt is checked against the source).
    assert site.hits("/feed") == 3
    # Same bytes, new ETag: the server says it is another version.
    site.pages["/feed"] = Page(b"x,y\n1,2\n", etag='"b"')
    changed = await call("read_source", source="F")
    assert 'changed on re-read (ETag now "b")' in changed
    arts = {a.artifact_id: a for a in await call.store.get_artifacts(call.task_id)}
    assert {i for i, a in arts.items() if not a.valid} == {fp, ev, claim}
    assert arts[_id(changed, "cite snapshot artifact ")].valid
    assert SECRET not in await _everything_stored(call.store, call.task_id)


async def test_an_api_source_asks_for_json_by_get_or_by_post_of_its_body(
    call: Calls, site: Site
) -> None:
    site.pages["/prices"] = Page(b'{"B": 35}')
    site.pages["/query"] = Page(b'{"B": {"price": 35}}')
    assert '{"B": 35}' in await call("read_source", source="G")
    assert '{"B": {"price": 35}}' in await call("read_source", source="Q")
    get, post = site.requests
    assert (get["method"], get["accept"], get["body"]) == ("GET", "application/json", b"")
    assert (post["method"], post["accept"]) == ("POST", "application/json")
    assert json.loads(post["body"]) == {"product": "B", "fields": ["price"]}


async def test_http_failures_fail_the_call_clearly_and_store_nothing(
    call: Calls, site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(errors.ToolFailed, match="answered HTTP 404"):
        await call("read_source", source="MISSING")
    monkeypatch.setattr(st, "HTTP_TIMEOUT", 0.3)
    with pytest.raises(errors.ToolFailed, match=r"did not answer within 0\.3 s"):
        await call("read_source", source="SLOW")
    site.pages["/page"] = Page(b"x" * 100)
    monkeypatch.setattr(st, "MAX_SNAPSHOT_BYTES", 50)
    with pytest.raises(errors.ToolFailed, match="larger than") as exc:
        await call("read_source", source="P")
    assert SECRET not in str(exc.value) and "***" in str(exc.value)
    assert await call.store.get_artifacts(call.task_id) == []


def test_url_and_api_sources_are_checked_in_the_contract() -> None:
    base = {"objective": "o", "items": [{"id": "i", "title": "t"}]}
    bad = [
        ({"kind": "url", "location": "ftp://x/y"}, "must be an http"),
        ({"kind": "api", "location": "/etc/passwd"}, "must be an http"),
        ({"kind": "url", "location": "http://x/", "method": "POST"}, "api sources only"),
        ({"kind": "document", "location": "a.md", "body": {"a": 1}}, "api sources only"),
        ({"kind": "api", "location": "http://x/", "body": {"a": 1}}, "method: POST"),
    ]
    for extra, message in bad:
        with pytest.raises(errors.SpecError, match=message):
            parse_spec({**base, "sources": [{"id": "S", "version": "1", **extra}]})
