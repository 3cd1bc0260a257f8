from fastapi import APIRouter
from fastapi.responses import JSONResponse

from gpu_share._version import __version__
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.coordinator.services.platform import health
from gpu_share.protocol.health import Health

router = APIRouter(tags=["discovery"])


@router.get(
    "/health",
    response_model=Health,
    responses={503: {"model": Health, "description": "The database is unreachable"}},
)
async def get_health(replica: ReplicaDep) -> JSONResponse:
    """Liveness and readiness; needs no key."""
    report = await health.check(replica.db, replica.clock.now(), __version__, replica.settings)
    return JSONResponse(report.model_dump(), status_code=200 if report.status == "ok" else 503)
