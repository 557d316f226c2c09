"""`tether worker`: a `Worker` on the database until stopped (see `runtime.worker`)."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.text import Text

from tether import errors, placement
from tether._extras import needs
from tether.cli import _logging
from tether.cli._app import (
    DbOpt,
    ModelOpt,
    ModelRetriesOpt,
    ModelTimeoutOpt,
    NoMigrateOpt,
    app,
    err,
    fail,
    lasting_db,
    model_options,
    run_async,
)
from tether.cli.views import clean

log = logging.getLogger("tether.worker")

if TYPE_CHECKING:
    import asyncio

    from tether.metrics import ProcessMetrics
    from tether.runtime.engine import RunResult, Snapshot
    from tether.runtime.worker import WorkerStats
    from tether.store import Store


def _say(line: str, *, style: str = "", **fields: Any) -> None:
    """One of the worker's own lines on stderr; with `--log-format json` an info
    record instead (with `fields`: task id, round, event), so that every line there
    is JSON."""
    if _logging.json_mode():
        log.info("%s", line, extra=fields)
    else:
        err.print(Text(clean(line, lines=True), style=style))


def _db_shown(store: Store, db: str | None) -> str:
    """The database a worker takes its tasks from, as a person finds it again: a SQLite
    file by its absolute path (`sqlite:///.tether/tether.db` names another file in
    every folder); a password is masked when printed (`views.clean`)."""
    from tether.store import default_url

    url = str(getattr(store, "url", None) or db or default_url())
    path = getattr(store, "path", None)
    if url.startswith("sqlite:///") and isinstance(path, str):
        query = url.partition("?")[2]
        return f"sqlite:///{Path(path).resolve()}" + (f"?{query}" if query else "")
    return url


def _report(result: RunResult) -> None:
    # Spelled as `status` and `list` spell it: "satisfied (delivered)".
    why = f" ({result.stop_reason})" if result.stop_reason else ""
    _say(f"task {result.task_id}: {result.status}{why}", task_id=result.task_id, event="task.ran")


def _report_error(task_id: str, exc: Exception) -> None:
    _say(f"task {task_id}: could not run: {exc}", task_id=task_id, event="task.failed_to_run")


def _round_line(snap: Snapshot) -> None:
    """A line per finished round of every task this worker runs."""
    if not snap.message.startswith("round "):
        return
    p = snap.progress
    _say(
        f"task {snap.task_id} {snap.message} — {p.done}/{p.total} done, "
        f"{snap.tokens} tokens, ${snap.cost_usd:.4f}",
        style="dim",
        task_id=snap.task_id,
        event="round.ended",
    )


class MetricsServer:
    """`/metrics`, `/healthz` and `/readyz` of a worker, served by `prometheus_client`'s
    WSGI app and the standard library's threading WSGI server, in a thread of its own:
    a scrape never waits on the worker's event loop, except for `/readyz` and the
    database's figures (`--cluster-metrics`), which run their queries on it."""

    def __init__(
        self,
        store: Store,
        loop: asyncio.AbstractEventLoop,
        process: ProcessMetrics,
        *,
        cluster: bool,
    ) -> None:
        from prometheus_client import make_wsgi_app

        from tether.metrics import ClusterCollector, blocking_reader

        self.store = store
        self.loop = loop
        if cluster:
            process.registry.register(ClusterCollector(blocking_reader(store, loop)))
        self.metrics_app = make_wsgi_app(process.registry)
        self.server: Any = None

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        """The WSGI entry point."""
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return self.metrics_app(environ, start_response)  # type: ignore[no-any-return]
        if path == "/healthz":
            return _answer(start_response, "200 OK", b"ok\n")
        if path == "/readyz":
            body, ready = self._readiness()
            status = "200 OK" if ready else "503 Service Unavailable"
            return _answer(start_response, status, body, "application/json")
        return _answer(start_response, "404 Not Found", b"/metrics, /healthz or /readyz\n")

    def _readiness(self) -> tuple[bytes, bool]:
        import asyncio
        import concurrent.futures
        import json

        from tether.metrics import READY_TIMEOUT, Readiness, readiness

        future = asyncio.run_coroutine_threadsafe(readiness(self.store), self.loop)
        try:
            ready = future.result(READY_TIMEOUT + 5)
        except concurrent.futures.TimeoutError:
            future.cancel()
            ready = Readiness(False, "the worker's event loop did not answer")
        return json.dumps(ready.to_dict()).encode() + b"\n", ready.ready

    def start(self, host: str, port: int) -> str:
        """Listen on `host:port` (port 0: any free one); returns the base URL."""
        import socket
        import threading
        from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

        from prometheus_client.exposition import ThreadingWSGIServer

        class Quiet(WSGIRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                log.debug("metrics %s %s", self.address_string(), format % args)

        server_class: type[WSGIServer] = ThreadingWSGIServer
        if ":" in host:
            server_class = type("V6", (ThreadingWSGIServer,), {"address_family": socket.AF_INET6})
        try:
            self.server = make_server(host, port, self, server_class, handler_class=Quiet)
        except (OSError, OverflowError) as exc:
            raise errors.UserError(
                f"--metrics-host {host} --metrics-port {port}: cannot listen: {exc}"
            ) from None
        threading.Thread(
            target=self.server.serve_forever, name="tether-metrics", daemon=True
        ).start()
        bound = self.server.server_address[1]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{bound}"

    def close(self) -> None:
        """Stop serving."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def _answer(start_response: Any, status: str, body: bytes, kind: str = "text/plain") -> list[bytes]:
    start_response(
        status, [("Content-Type", f"{kind}; charset=utf-8"), ("Content-Length", str(len(body)))]
    )
    return [body]


def _seconds(value: float) -> float:
    if not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a number of seconds")
    return value


def _as_seconds(value: str | None) -> float | None:
    """A DURATION (`90`, `90s`, `10m`, `6h`, `1d`) in seconds; None for None."""
    from tether.schedule import duration_seconds

    return duration_seconds(value) if value is not None else None


def _duration(value: str | None) -> str | None:
    seconds = _as_seconds(value)
    if value is not None and (seconds is None or not 1 <= seconds <= 366 * 86400):
        raise typer.BadParameter(
            f"{value!r} is not a duration from 1s to 366d (a number with s, m, h or d)"
        )
    return value


@app.command()
def worker(
    db: DbOpt = None,
    model: ModelOpt = None,
    once: Annotated[bool, typer.Option("--once", help="Exit when no task is claimable.")] = False,
    poll: Annotated[
        float,
        typer.Option(
            "--poll",
            metavar="SECONDS",
            help="Seconds between polls.",
            min=0.01,
            max=3600,
            callback=_seconds,
        ),
    ] = 2.0,
    lease: Annotated[
        float,
        typer.Option(
            "--lease",
            metavar="SECONDS",
            help="Seconds a claim holds a task (renewed every third); a dead worker's task "
            "waits that long for another (two thirds of it on the same machine).",
            min=1,
            max=3600,
            callback=_seconds,
        ),
    ] = 60.0,
    quiet: Annotated[
        bool, typer.Option("--quiet", help="No line per round; only how each task ended.")
    ] = False,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            metavar="PORT",
            help="Serve this worker's Prometheus metrics at /metrics, and /healthz and "
            "/readyz, on this port (0: any free one; extra metrics).",
            min=0,
            max=65535,
        ),
    ] = None,
    metrics_host: Annotated[
        str | None,
        typer.Option(
            "--metrics-host",
            metavar="ADDRESS",
            help="Address the metrics port listens on (127.0.0.1 by default; 0.0.0.0: "
            "every interface).",
            show_default=False,
        ),
    ] = None,
    cluster_metrics: Annotated[
        bool,
        typer.Option(
            "--cluster-metrics",
            help="Also export the database's figures (tasks by status, ...) on /metrics: "
            "give it to one worker, or scrape the dashboard's /metrics instead.",
        ),
    ] = False,
    concurrency: Annotated[
        int,
        typer.Option(
            "--concurrency",
            metavar="N",
            help="Tasks run at once by this process, on one event loop (each with its own "
            "lease); they share one database connection pool.",
            min=1,
            max=10000,
        ),
    ] = 1,
    grace: Annotated[
        float,
        typer.Option(
            "--grace",
            metavar="SECONDS",
            help="Seconds a stop (SIGINT, SIGTERM) gives the running tasks to finish their "
            "round and commit; then each stops at its next safe point and is handed back "
            "(0: at once; a second signal ends the grace).",
            min=0,
            max=86400,
            callback=_seconds,
        ),
    ] = 0.0,
    pool_size: Annotated[
        int | None,
        typer.Option(
            "--pool-size",
            metavar="N",
            help="Database connections this process may hold, shared by its tasks "
            "(PostgreSQL; 8 by default; SQLite has one).",
            min=1,
            max=1000,
        ),
    ] = None,
    host_tag: Annotated[
        list[str] | None,
        typer.Option(
            "--host-tag",
            metavar="TAG",
            help="A tag of this machine (repeatable): tasks whose contract says `runs_on` "
            "run only on workers with one of its tags.",
        ),
    ] = None,
    model_timeout: ModelTimeoutOpt = None,
    model_retries: ModelRetriesOpt = None,
    no_migrate: NoMigrateOpt = False,
    verify_every: Annotated[
        str | None,
        typer.Option(
            "--verify-every",
            metavar="DURATION",
            help="Verify delivered tasks again this often (90s, 10m, 6h, 1d; as tether "
            "verify): what broke goes back to work. Off by default.",
            callback=_duration,
        ),
    ] = None,
) -> None:
    """Claim and run tasks from the database until stopped (SIGINT or SIGTERM: no new
    claim; each running task finishes its round within --grace, else stops at its next
    safe point, and is handed back).

    Each runs with the model, model options and TETHER_TOOLS it was started with; the
    model options given here, or this worker's TETHER_TOOLS, override them."""
    import asyncio

    from tether.runtime.engine import inline_wait_max_from_env
    from tether.runtime.takeover import process_id
    from tether.runtime.watch.sinks import default_notifier
    from tether.runtime.wiring import open_runtime
    from tether.runtime.worker.tuning import settle_process, tune_process

    if cluster_metrics and metrics_port is None:
        raise fail(errors.UserError("--cluster-metrics needs --metrics-port"), 2)
    if metrics_host is not None and metrics_port is None:
        raise fail(errors.UserError("--metrics-host needs --metrics-port"), 2)
    try:
        tags = placement.host_tags(host_tag or [])
    except errors.UserError as exc:
        raise fail(exc, 2) from None
    if metrics_port is not None:
        # A missing extra is said before the database is opened (or created).
        try:
            with needs("metrics", "tether worker --metrics-port"):
                import prometheus_client  # noqa: F401

                from tether.metrics import ProcessMetrics
        except errors.UserError as exc:
            raise fail(exc, 2) from None

    tune_process()  # this process is the worker's: its collector set for many runs

    async def main() -> WorkerStats:
        # The environment's settings are refused now, not by every sweep or task later.
        default_notifier()
        inline_wait_max_from_env()
        options = model_options(model_timeout, model_retries)
        lasting_db(db, "a worker there never finds a task")
        async with open_runtime(
            db, model=model, model_options=options, migrate=not no_migrate
        ) as rt:
            worker_id = process_id()
            process: ProcessMetrics | None = None
            server: MetricsServer | None = None
            stop_listening: Any = None
            if metrics_port is not None:
                import prometheus_client

                prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
                process = ProcessMetrics(worker_id)
                server = MetricsServer(
                    rt.store, asyncio.get_running_loop(), process, cluster=cluster_metrics
                )
                base = server.start(metrics_host or "127.0.0.1", metrics_port)
                stop_listening = process.install()
                _say(f"metrics at {base}/metrics (health: {base}/healthz, {base}/readyz)")

            def on_result(result: RunResult) -> None:
                if process is not None:
                    process.finished(result.status)
                _report(result)

            log.debug(
                "worker %s: poll %g s, lease %g s, concurrency %d, grace %g s",
                worker_id, poll, lease, concurrency, grace,
            )  # fmt: skip
            try:
                w = rt.worker(
                    worker_id=worker_id,
                    once=once,
                    poll_interval=poll,
                    lease_ttl=lease,
                    concurrency=concurrency,
                    grace=grace,
                    pool_size=pool_size,
                    on_stopping=lambda line: _say(line, event="worker.stopping"),
                    verify_every=_as_seconds(verify_every),
                    host_tags=tags,
                    handle_signals=True,
                    on_result=on_result,
                    on_error=_report_error,
                    **({} if quiet else {"on_progress": _round_line}),
                )
                if not quiet:  # a worker with nothing to do is silent: say it is there
                    _say(
                        f"worker {worker_id} takes tasks from {_db_shown(rt.store, db)}"
                        + (" until none is left" if once else "; Ctrl-C stops it"),
                        event="worker.started",
                    )
                settle_process()  # the store is open: what lives as long as the process, frozen
                return await w.run()
            finally:
                if stop_listening is not None:
                    stop_listening()
                if server is not None:
                    server.close()

    stats = run_async(main)
    _say(f"worker ran {stats.ran} task(s)")
    if stats.failed:
        _say(f"{stats.failed} task run(s) failed; see above")
        raise typer.Exit(1)
