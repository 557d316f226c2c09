"""The dashboard's ASGI application: one store, one token, pages, API, stream, metrics.

`create_app(db, token=...)` returns a FastAPI app that opens the store at start-up and
closes it at shutdown. Interfaces hold no business logic: every page and API call reads
projections or calls the same library functions as the CLI (`tether.approvals`,
`tether.decisions`, `tether.edits`, `tether.runtime.tasks`, `tether.report`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from importlib.resources import files
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from tether import errors
from tether.store import Store
from tether.web.security import Access, Refused

#: Host names every server answers to, besides the one it binds.
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


class HostCheck:
    """Refuses requests under a host name the server does not know (before routing)."""

    def __init__(self, app: ASGIApp, access: Access) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI entry point."""
        if scope["type"] == "http":
            try:
                self.access.check_host(Request(scope))
            except Refused as exc:
                await PlainTextResponse(str(exc), status_code=403)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(
    db: str | None,
    *,
    token: str,
    hosts: Iterable[str] = (),
    store: Store | None = None,
    poll: float = 0.5,
) -> FastAPI:
    """The dashboard for the database `db` (or an already open `store`, which the app
    then does not close). `hosts`: names it answers to besides the local ones; `poll`:
    how often the live stream looks for new events, in seconds."""
    from tether.web import api, live, metrics, pages

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        from tether.runtime.wiring import open_db

        own = store is None
        app.state.store = store if store is not None else await open_db(db, create=False)
        try:
            yield
        finally:
            if own:
                await app.state.store.close()

    app = FastAPI(
        title="tether",
        summary="The JSON API of a tether dashboard: what the CLI shows and decides.",
        version="1",
        lifespan=lifespan,
        # The interactive docs pages load scripts from the network: only the schema.
        docs_url=None,
        redoc_url=None,
        openapi_url="/api/openapi.json",
    )
    access = Access(token, frozenset(h.lower() for h in (*LOCAL_HOSTS, *hosts)))
    app.state.access = access
    app.state.poll = poll
    app.add_middleware(HostCheck, access=access)
    app.mount("/static", StaticFiles(directory=str(files("tether.web") / "static")), "static")
    app.include_router(api.router)
    app.include_router(pages.router)
    app.include_router(live.router)
    app.include_router(metrics.router)

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused) -> Any:
        return error_response(request, 403, str(exc))

    @app.exception_handler(errors.TaskNotFound)
    async def not_found(request: Request, exc: errors.TaskNotFound) -> Any:
        return error_response(request, 404, str(exc))

    @app.exception_handler(errors.UserError)
    async def bad_input(request: Request, exc: errors.UserError) -> Any:
        return error_response(request, 400, str(exc))

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> Any:
        return error_response(request, 400, api.body_problem(exc))

    @app.exception_handler(errors.AlreadySettled)
    async def settled(request: Request, exc: errors.AlreadySettled) -> Any:
        return error_response(request, 409, str(exc))

    @app.exception_handler(errors.TaskBusy)
    async def busy(request: Request, exc: errors.TaskBusy) -> Any:
        return error_response(request, 409, str(exc))

    @app.exception_handler(errors.StoreUnavailable)
    async def unavailable(request: Request, exc: errors.StoreUnavailable) -> Any:
        return error_response(request, 503, str(exc))

    @app.exception_handler(errors.TetherError)
    async def conflict(request: Request, exc: errors.TetherError) -> Any:
        return error_response(request, 409, str(exc))

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> Response:
        # Browsers ask for it on every page that names none (the report): no icon.
        return Response(status_code=204)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> PlainTextResponse:
        return PlainTextResponse("ok")

    return app


def error_response(request: Request, status: int, message: str) -> Any:
    """JSON `{"detail": message}` for the API, an HTML page for a browser."""
    if request.url.path.startswith("/api/"):
        return JSONResponse({"detail": message}, status_code=status)
    from tether.web.pages import error_page

    return error_page(request, status, message)
