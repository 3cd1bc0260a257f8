"""Prometheus' scrape (docs/operations.md, "Metrics and logs")."""

from fastapi import APIRouter, Response

from gpu_share.coordinator.api.auth import Scraper
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.core import metrics
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.coordinator.services.platform import metrics as state

router = APIRouter(tags=["admin"])


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"content": {metrics.CONTENT_TYPE: {}}, "description": "Prometheus text format"},
        **errors(*AUTH),
    },
)
async def scrape(_scraper: Scraper, replica: ReplicaDep) -> Response:
    """The coordinator's metrics in Prometheus' text format: what this process counted
    (every process's, with `PROMETHEUS_MULTIPROC_DIR`) and the state of queues, nodes,
    sessions, storage, money, payouts and deliveries. Bearer `GPUSHARE_METRICS_TOKEN`,
    or an admin key."""
    async with replica.db.read() as session:
        readings = await state.readings(session, replica.clock.now(), replica.settings)
    return Response(metrics.exposition(readings), media_type=metrics.CONTENT_TYPE)
