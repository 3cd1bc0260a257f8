"""Provider dashboard: Pricing. Per GPU model of the provider's machines, its price and
spot discount, a form to change them, and what the market suggests beside it."""

from collections import defaultdict
from dataclasses import dataclass, field

from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import ValidationError

from gpu_share.coordinator.core.errors import ApiError
from gpu_share.coordinator.services.market import price_recommendations
from gpu_share.coordinator.services.nodes import prices
from gpu_share.coordinator.web.pages import Browser, SignedProvider, form_of, text, typed
from gpu_share.protocol.money import usdc_text
from gpu_share.protocol.prices import (
    MAX_PRICE_MICRO,
    MAX_SPOT_DISCOUNT_PCT,
    MIN_SPOT_DISCOUNT_PCT,
    Price,
    PriceUpdate,
    Recommendation,
)

router = APIRouter(prefix="/provider", include_in_schema=False)

FIELDS = {"price_per_gpu_hour": "price", "spot_discount_pct": "discount"}
DEFAULT_DISCOUNT_PCT = 50  # what the form offers for a model not priced yet


@dataclass
class ModelPricing:
    """One card: a model, its price (if any), what the form shows, and the market."""

    gpu_model: str
    machines: int
    price: Price | None
    recommendations: list[Recommendation]
    entered: dict[str, str] = field(default_factory=dict)  # price, discount
    errors: dict[str, str] = field(default_factory=dict)  # price, discount, form


async def _cards(browser: Browser, provider_id: str) -> list[ModelPricing]:
    async with browser.replica.db.read() as session:
        listed = await prices.list_prices(session, provider_id)
        machines = await prices.machines_by_model(session, provider_id)
        market = await price_recommendations.for_provider(session, provider_id, browser.now())
    by_model: dict[str, list[Recommendation]] = defaultdict(list)
    for recommendation in market:
        by_model[recommendation.gpu_model].append(recommendation)
    priced = {p.gpu_model: p for p in listed.prices}
    cards = []
    for model in sorted({*priced, *listed.unpriced_models}):
        price = priced.get(model)
        cards.append(
            ModelPricing(
                gpu_model=model,
                machines=machines.get(model, 0),
                price=price,
                recommendations=by_model[model],
                entered={
                    "price": price.price_per_gpu_hour if price else "",
                    "discount": str(price.spot_discount_pct if price else DEFAULT_DISCOUNT_PCT),
                },
            )
        )
    # Models running now first, CPU nodes after GPUs; then prices no machine uses any more.
    return sorted(cards, key=lambda c: (c.machines == 0, c.gpu_model == prices.CPU_MODEL))


def _render(browser: Browser, cards: list[ModelPricing], status: int = 200) -> Response:
    return browser.render(
        "provider/pricing.html",
        status=status,
        cards=cards,
        min_discount=MIN_SPOT_DISCOUNT_PCT,
        max_discount=MAX_SPOT_DISCOUNT_PCT,
        max_price=usdc_text(MAX_PRICE_MICRO),
        default_discount=DEFAULT_DISCOUNT_PCT,
        anchor=anchor,
        ordinal=ordinal,
    )


@router.get("/pricing")
async def pricing(signed: SignedProvider) -> Response:
    browser, provider = signed
    return _render(browser, await _cards(browser, provider.provider_id))


def _clean(message: str) -> str:
    message = message.removeprefix("Value error, ")
    if message.startswith("USDC has six decimal places"):
        return "use at most 6 decimal places (USDC counts in millionths)"
    if message.startswith("Input should be a valid integer"):
        return "give a whole number of percent, such as 40"
    if message.startswith(("Input should be greater", "Input should be less")):
        return f"must be between {MIN_SPOT_DISCOUNT_PCT} and {MAX_SPOT_DISCOUNT_PCT} percent"
    return message


@router.post("/pricing")
async def save_price(signed: SignedProvider) -> Response:
    browser, provider = signed
    form = await form_of(browser)
    model = text(form, "gpu_model")
    entered = {"price": typed(form, "price"), "discount": text(form, "discount")}
    errors: dict[str, str] = {}
    try:
        update = PriceUpdate.model_validate(
            {"price_per_gpu_hour": entered["price"], "spot_discount_pct": entered["discount"]}
        )
    except ValidationError as exc:
        for error in exc.errors():
            name = FIELDS.get(str(error["loc"][0]) if error["loc"] else "", "form")
            errors.setdefault(name, _clean(error["msg"]))
    else:
        try:
            async with browser.replica.db.write() as session:
                saved = await prices.set_price(
                    session, provider.provider_id, model, update, browser.now()
                )
        except ApiError as exc:
            errors["form"] = exc.message.removeprefix("gpu_model: ")
        else:
            return browser.redirect(
                "/provider/pricing",
                flash=(
                    f"Saved: {saved.gpu_model} at {saved.price_per_gpu_hour} USDC per GPU-hour, "
                    f"spot {saved.spot_price_per_gpu_hour} ({saved.spot_discount_pct} % off). "
                    "New work pays it; work already running keeps its rate."
                ),
            )
    cards = await _cards(browser, provider.provider_id)
    target = next((c for c in cards if c.gpu_model == model), None)
    if target is None:  # a model this provider does not run: say so above everything
        target = ModelPricing(model, 0, None, [])
        cards.insert(0, target)
    target.entered, target.errors = entered, errors
    return _render(browser, cards, status=422)


@router.post("/pricing/remove")
async def remove_price(signed: SignedProvider) -> Response:
    browser, provider = signed
    form = await form_of(browser)
    model = text(form, "gpu_model")
    try:
        async with browser.replica.db.write() as session:
            await prices.remove_price(session, provider.provider_id, model)
    except ApiError as exc:
        return browser.redirect("/provider/pricing", flash=f"Nothing removed: {exc.message}.")
    return browser.redirect(
        "/provider/pricing",
        flash=f"Removed the price of {model}: its machines are listed without one for new work.",
    )


def anchor(gpu_model: str) -> str:
    """An id for a model's card: "NVIDIA H100 80GB HBM3" → "model-nvidia-h100-80gb-hbm3"."""
    slug = "".join(ch if ch.isalnum() else "-" for ch in gpu_model.casefold())
    return "model-" + "-".join(part for part in slug.split("-") if part)


def ordinal(number: int) -> str:
    """6 → "6th", 21 → "21st", 12 → "12th"."""
    suffix = (
        "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    )
    return f"{number}{suffix}"
