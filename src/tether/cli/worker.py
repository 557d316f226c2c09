"""`tether worker`: a `Worker` on the database until stopped (see `runtime.worker`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from tether.cli._app import DbOpt, ModelOpt, app, err, run_async
from tether.cli.views import clean

if TYPE_CHECKING:
    from tether.runtime.engine import RunResult
    from tether.runtime.worker import WorkerStats


def _report(result: RunResult) -> None:
    err.print(Text(clean(f"task {result.task_id}: {result.status} {result.stop_reason or ''}")))


def _report_error(task_id: str, exc: Exception) -> None:
    err.print(Text(clean(f"task {task_id}: could not run: {exc}", lines=True)))


def _seconds(value: float) -> float:
    if not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a number of seconds")
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
) -> None:
    """Claim and run tasks from the database until stopped."""
    from tether.runtime.wiring import open_runtime

    async def main() -> WorkerStats:
        async with open_runtime(db, model=model) as rt:
            w = rt.worker(
                once=once,
                poll_interval=poll,
                handle_signals=True,
                on_result=_report,
                on_error=_report_error,
            )
            return await w.run()

    stats = run_async(main)
    err.print(f"worker ran {stats.ran} task(s)")
    if stats.failed:
        err.print(f"{stats.failed} task run(s) failed; see above")
        raise typer.Exit(1)
