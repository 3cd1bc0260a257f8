"""The marketplace in the tenant console (SPEC §4.2): the same offers as GET /v1/offers,
verified machines only unless the tenant ticks the box that shows the others."""

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError

from gpu_share.coordinator.services.market import offers
from gpu_share.coordinator.services.nodes.ranking import WEIGHTS
from gpu_share.coordinator.web.pages import SignedTenant
from gpu_share.protocol.nodes import Tier
from gpu_share.protocol.offers import OfferQuery, OfferSort
from gpu_share.protocol.runtimes import RuntimeName

router = APIRouter(include_in_schema=False)

FILTERS = (
    "gpu_model",
    "min_vram_gb",
    "max_price",
    "region",
    "tier",
    "min_reliability",
    "runtime",
    "gpus",
    "nvlink",
    "include_unverified",
    "sort",
)


@router.get("/console/marketplace")
async def marketplace(request: Request, signed: SignedTenant) -> Response:
    browser, _tenant = signed
    values = {name: request.query_params.get(name, "").strip() for name in FILTERS}
    values["max_price"] = request.query_params.get("max_price", "")  # money: as typed
    errors: dict[str, str] = {}
    try:
        query = OfferQuery.model_validate({k: v for k, v in values.items() if v})
    except ValidationError as exc:
        for problem in exc.errors():
            name = str(problem["loc"][0]) if problem["loc"] else "form"
            errors.setdefault(name, str(problem["msg"]).removeprefix("Value error, "))
        query = OfferQuery()
    async with browser.replica.db.read() as session:
        found = await offers.search(session, query, browser.now(), browser.replica.settings)
    return browser.render(
        "tenant/marketplace.html",
        offers=found,
        values=values,
        errors=errors,
        sorts=list(OfferSort),
        tiers=list(Tier),
        runtimes=list(RuntimeName),
        weights=WEIGHTS,
    )
