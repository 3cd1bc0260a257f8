"""The marketplace in the tenant console (SPEC §4.2): the same offers as GET /v1/offers,
verified machines only unless the tenant ticks the box that shows the others."""

import math

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
    given: dict[str, object] = {k: v for k, v in values.items() if v}
    if "min_reliability" in given:  # a percentage on the page, a fraction in the query
        fraction = _fraction(values["min_reliability"])
        if fraction is None:
            errors["min_reliability"] = "give a percentage from 0 to 100, such as 90"
            del given["min_reliability"]
        else:
            given["min_reliability"] = fraction
    try:
        query = OfferQuery.model_validate(given)
    except ValidationError as exc:
        for problem in exc.errors():
            name = str(problem["loc"][0]) if problem["loc"] else "form"
            errors.setdefault(name, str(problem["msg"]).removeprefix("Value error, "))
        query = OfferQuery()
    if errors:
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


def _fraction(percent: str) -> float | None:
    """A percentage as typed (90, 90 %) as the fraction the query takes; None when it is
    not one from 0 to 100."""
    try:
        value = float(percent.strip().removesuffix("%"))
    except ValueError:
        return None
    return value / 100 if math.isfinite(value) and 0 <= value <= 100 else None
