"""The marketplace (SPEC §4.2): `GET /v1/offers`."""

from typing import Annotated

from fastapi import APIRouter, Query

from gpu_share.coordinator.api.auth import TenantOrAdmin
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.coordinator.services.market import offers
from gpu_share.protocol.offers import Offer, OfferQuery

router = APIRouter(tags=["discovery"])


@router.get("/v1/offers", response_model=list[Offer], responses=errors(*AUTH, 422))
async def list_offers(
    _viewer: TenantOrAdmin, replica: ReplicaDep, query: Annotated[OfferQuery, Query()]
) -> list[Offer]:
    """What can run work now: online, listed nodes inside their availability windows, with
    the scores placement ranks them by (reliability, benchmark, price) and their parts."""
    async with replica.db.read() as session:
        return await offers.search(session, query, replica.clock.now(), replica.settings)
