"""`/metrics`: the database's figures as Prometheus text (`tether.metrics`).

The dashboard exports what the database holds (tasks by status and by what they wait
for, the oldest queued task's wait, the newest tasks' usage, the contracts' services'
breakers) in a fixed number of queries per scrape; each worker exports its own figures
on its own port (`tether worker --metrics-port`), so sums over processes are right.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from starlette.requests import Request

from tether.metrics import CONTENT_TYPE, ClusterCollector, cluster_snapshot, render
from tether.web.deps import state_of

router = APIRouter(include_in_schema=False)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus metrics of the database."""
    store, _ = state_of(request)
    body = render(ClusterCollector.fixed(await cluster_snapshot(store)))
    return Response(body, media_type=CONTENT_TYPE)
