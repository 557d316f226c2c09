"""The dashboard's ASGI application: one store, its tokens, pages, API, stream, metrics.

`create_app(db, token=...)` returns a FastAPI app that opens the store at start-up and
closes it at shutdown. Interfaces hold no business logic: every page and API call reads
projections or calls the same library functions as the CLI (`tether.approvals`,
`tether.decisions`, `tether.edits`, `tether.runtime.tasks`, `tether.report`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
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
#: The health probes: answered under any host name (a load balancer or Kubernetes asks
#: by address), and they show no task.
PROBES = frozenset({"/healthz", "/readyz"})


class HostCheck:
    """Refuses requests under a host name the server does not know (before routing)."""

    def __init__(self, app: ASGIApp, access: Access) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI entry point."""
        if scope["type"] == "http" and scope.get("path") not in PROBES:
            try:
                self.access.check_host(Request(scope))
            except Refused as exc:
                await PlainTextResponse(str(exc), status_code=403)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(
    db: str | None,
    *,
    token: str | None,
    hosts: Iterable[str] = (),
    store: Store | None = None,
    poll: float = 0.5,
    named: Mapping[str, str] | None = None,
    forwarded_allow_ips: str | None = None,
    migrate: bool = True,
) -> FastAPI:
    """The dashboard for the database `db` (or an already open `store`, which the app
    then does not close). `token`: the shared token (None: only `named` ones, name ->
    token, see `security`); `hosts`: names it answers to besides the local ones (`*`:
    any); `forwarded_allow_ips`: the proxies whose `X-Forwarded-For` / `-Proto` headers
    are trusted (uvicorn's `ProxyHeadersMiddleware`: comma-separated addresses or
    networks, `*` for all); `migrate=False`: refuse a schema below this tether's;
    `poll`: how often the live stream looks for new events, in seconds."""
    from tether.web import api, live, metrics, pages

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        from tether.runtime.wiring import open_db

        own = store is None
        app.state.store = (
            store if store is not None else await open_db(db, create=False, migrate=migrate)
        )
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
    access = Access(token, frozenset(h.lower() for h in (*LOCAL_HOSTS, *hosts)), named or {})
    app.state.access = access
    app.state.poll = poll
    app.add_middleware(HostCheck, access=access)
    if forwarded_allow_ips:  # outermost: the checks see the client and scheme it gives
        from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=forwarded_allow_ips)
    app.mount("/static", StaticFiles(directory=str(files("tether.web") / "static")), "static")
    app.include_router(api.router)
    app.include_router(pages.router)
    app.include_router(live.router)
    app.include_router(metrics.router)

    for exc_type, status in _STATUS_OF:
        app.add_exception_handler(exc_type, _answer_with(status))

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> Any:
        return error_response(request, 400, api.body_problem(exc))

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> Response:
        # Browsers ask for it on every page that names none (the report): no icon.
        return Response(status_code=204)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> PlainTextResponse:
        # Live: the server answers (the database is /readyz's business).
        return PlainTextResponse("ok")

    @app.get("/readyz", include_in_schema=False)
    async def readyz(request: Request) -> JSONResponse:
        # Ready: the database answers and has this tether's schema; else 503 and why.
        from tether.metrics import readiness

        ready = await readiness(request.app.state.store)
        return JSONResponse(ready.to_dict(), status_code=200 if ready.ready else 503)

    return app


#: The HTTP status each refusal answers with, its message the exception's text. A
#: handler serves its class and the subclasses that have none of their own, so the
#: `TetherError` row catches the rest.
_STATUS_OF: tuple[tuple[type[Exception], int], ...] = (
    (Refused, 403),
    (errors.TaskNotFound, 404),
    (errors.UserError, 400),
    (errors.AlreadySettled, 409),
    (errors.TaskBusy, 409),
    (errors.StoreUnavailable, 503),
    (errors.TetherError, 409),
)


def _answer_with(status: int) -> Callable[[Request, Exception], Awaitable[Any]]:
    """An exception handler that answers `status` with the exception's text."""

    async def answer(request: Request, exc: Exception) -> Any:
        return error_response(request, status, str(exc))

    return answer


def error_response(request: Request, status: int, message: str) -> Any:
    """JSON `{"detail": message}` for the API, an HTML page for a browser."""
    if request.url.path.startswith("/api/"):
        return JSONResponse({"detail": message}, status_code=status)
    from tether.web.pages import error_page

    return error_page(request, status, message)
