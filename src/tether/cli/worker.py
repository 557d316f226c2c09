"""`tether worker`: a `Worker` on the database until stopped (see `runtime.worker`)."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from tether import errors
from tether._extras import needs
from tether.cli._app import (
    DbOpt,
    ModelOpt,
    ModelRetriesOpt,
    ModelTimeoutOpt,
    NoMigrateOpt,
    app,
    err,
    fail,
    model_options,
    run_async,
)
from tether.cli.views import clean

if TYPE_CHECKING:
    import asyncio

    from tether.runtime.engine import RunResult, Snapshot
    from tether.runtime.worker import WorkerStats
    from tether.store import Store


def _report(result: RunResult) -> None:
    # Spelled as `status` and `list` spell it: "satisfied (delivered)".
    why = f" ({result.stop_reason})" if result.stop_reason else ""
    err.print(Text(clean(f"task {result.task_id}: {result.status}{why}")))


def _report_error(task_id: str, exc: Exception) -> None:
    err.print(Text(clean(f"task {task_id}: could not run: {exc}", lines=True)))


def _round_line(snap: Snapshot) -> None:
    """A line per finished round of every task this worker runs."""
    if not snap.message.startswith("round "):
        return
    p = snap.progress
    err.print(
        Text(
            clean(
                f"task {snap.task_id} {snap.message} — {p.done}/{p.total} done, "
                f"{snap.tokens} tokens, ${snap.cost_usd:.4f}"
            ),
            style="dim",
        )
    )


async def _serve_metrics(store: Store, port: int) -> asyncio.Server:
    """Prometheus text at http://127.0.0.1:PORT/metrics: the same metrics as `tether
    serve`'s /metrics, computed from the database at each scrape."""
    import asyncio  # here: `tether --help` needs no event loop

    with needs("web", "tether worker --metrics-port"):
        from tether.web.metrics import render, snapshot

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            if request.split(b" ", 2)[1:2] != [b"/metrics"]:
                status, body, kind = b"404 Not Found", b"only /metrics here\n", b"text/plain"
            else:
                body = render(await snapshot(store))
                status, kind = b"200 OK", b"text/plain; version=0.0.4; charset=utf-8"
            writer.write(
                b"HTTP/1.1 " + status + b"\r\nContent-Type: " + kind
                + b"\r\nContent-Length: " + str(len(body)).encode()
                + b"\r\nConnection: close\r\n\r\n" + body
            )  # fmt: skip
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass
        finally:
            writer.close()

    try:
        return await asyncio.start_server(handle, "127.0.0.1", port)
    except OSError as exc:
        raise errors.UserError(f"--metrics-port {port}: cannot listen: {exc}") from exc


def _seconds(value: float) -> float:
    if not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a number of seconds")
    return value


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")


def _as_seconds(value: str | None) -> float | None:
    """A DURATION (`90`, `90s`, `10m`, `6h`, `1d`) in seconds; None for None."""
    found = _DURATION.fullmatch(value.strip()) if value is not None else None
    if found is None:
        return None
    return float(found[1]) * _UNITS[found[2] or "s"]


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
            "--poll", help="Seconds between polls.", min=0.01, max=3600, callback=_seconds
        ),
    ] = 2.0,
    lease: Annotated[
        float,
        typer.Option(
            "--lease",
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
            help="Serve Prometheus metrics at http://127.0.0.1:PORT/metrics (extra web).",
            min=0,
            max=65535,
        ),
    ] = None,
    concurrency: Annotated[
        int,
        typer.Option(
            "--concurrency",
            help="Tasks run at once by this process, on one event loop (each with its own "
            "lease); they share one database connection pool.",
            min=1,
            max=10000,
        ),
    ] = 1,
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
    claim; each running task stops after its current step and is handed back).

    Each runs with the model, model options and TETHER_TOOLS it was started with; the
    model options given here, or this worker's TETHER_TOOLS, override them."""
    from tether.runtime.engine import inline_wait_max_from_env
    from tether.runtime.watch.sinks import default_notifier
    from tether.runtime.wiring import open_runtime

    if metrics_port is not None:
        # A missing extra is said before the database is opened (or created).
        try:
            with needs("web", "tether worker --metrics-port"):
                import tether.web.metrics  # noqa: F401
        except errors.UserError as exc:
            raise fail(exc, 2) from None

    async def main() -> WorkerStats:
        # The environment's settings are refused now, not by every sweep or task later.
        default_notifier()
        inline_wait_max_from_env()
        options = model_options(model_timeout, model_retries)
        async with open_runtime(
            db, model=model, model_options=options, migrate=not no_migrate
        ) as rt:
            server = None
            if metrics_port is not None:
                server = await _serve_metrics(rt.store, metrics_port)
                port = server.sockets[0].getsockname()[1]
                err.print(f"metrics at http://127.0.0.1:{port}/metrics")
            try:
                w = rt.worker(
                    once=once,
                    poll_interval=poll,
                    lease_ttl=lease,
                    concurrency=concurrency,
                    verify_every=_as_seconds(verify_every),
                    handle_signals=True,
                    on_result=_report,
                    on_error=_report_error,
                    **({} if quiet else {"on_progress": _round_line}),
                )
                return await w.run()
            finally:
                if server is not None:
                    server.close()

    stats = run_async(main)
    err.print(f"worker ran {stats.ran} task(s)")
    if stats.failed:
        err.print(f"{stats.failed} task run(s) failed; see above")
        raise typer.Exit(1)
