"""Provider dashboard: Incidents. Which of their nodes a spot check caught, why, and what it
cost (docs/trust.md); the tenant's job and data are not theirs to see."""

from fastapi import APIRouter
from fastapi.responses import Response

from gpu_share.coordinator.services.trust import incidents
from gpu_share.coordinator.web.pages import SignedProvider

router = APIRouter(prefix="/provider", include_in_schema=False)


@router.get("/incidents")
async def incidents_page(signed: SignedProvider) -> Response:
    browser, provider = signed
    async with browser.replica.db.read() as db:
        listed = await incidents.listed(db, provider_id=provider.provider_id)
    return browser.render("provider/incidents.html", incidents=listed)
