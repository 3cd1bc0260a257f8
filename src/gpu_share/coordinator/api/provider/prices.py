"""A provider's prices per GPU model, and recommendations from the market (SPEC §3.4).

    GET    /v1/provider/prices                   (provider) your prices, and models unpriced
    PUT    /v1/provider/prices/{gpu_model}       (provider) set one model's price
    DELETE /v1/provider/prices/{gpu_model}       (provider) remove it
    GET    /v1/provider/prices/recommendations   (provider) per model and region

`gpu_model` is the model as your agents report it ("NVIDIA H100 80GB HBM3", URL-encoded:
`NVIDIA%20H100%2080GB%20HBM3`), or `cpu` for CPU nodes. A change applies to work placed
after it. Another provider's prices are neither shown nor reachable.
"""

from typing import Annotated

from fastapi import APIRouter, Path

from gpu_share.coordinator.api.auth import ProviderPrincipal
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.coordinator.services.market import price_recommendations
from gpu_share.coordinator.services.nodes import prices
from gpu_share.protocol.prices import Price, PriceUpdate, ProviderPrices, Recommendation

router = APIRouter(prefix="/v1/provider/prices", tags=["prices"])

GpuModel = Annotated[
    str,
    Path(
        min_length=1,
        max_length=200,
        description='The GPU model as your agents report it, or "cpu"; URL-encode spaces',
    ),
]


@router.get("", response_model=ProviderPrices, responses=errors(*AUTH))
async def my_prices(provider: ProviderPrincipal, replica: ReplicaDep) -> ProviderPrices:
    """Your price per GPU model, and the models your machines run without one."""
    async with replica.db.read() as session:
        return await prices.list_prices(session, provider.provider_id)


@router.get("/recommendations", response_model=list[Recommendation], responses=errors(*AUTH))
async def recommendations(provider: ProviderPrincipal, replica: ReplicaDep) -> list[Recommendation]:
    """Per GPU model and region of your machines: what other providers charge, weighted by
    how much their machines are used (docs/pricing.md), and where your price stands."""
    async with replica.db.read() as session:
        return await price_recommendations.for_provider(
            session, provider.provider_id, replica.clock.now()
        )


@router.put("/{gpu_model}", response_model=Price, responses=errors(*AUTH, 422))
async def set_price(
    gpu_model: GpuModel, body: PriceUpdate, provider: ProviderPrincipal, replica: ReplicaDep
) -> Price:
    """Set the on-demand price per GPU-hour and the spot discount for a model your
    machines run. Work already placed keeps its rate; new work pays the new one."""
    async with replica.db.write() as session:
        return await prices.set_price(
            session, provider.provider_id, gpu_model, body, replica.clock.now()
        )


@router.delete("/{gpu_model}", status_code=204, responses=errors(*AUTH, 404, 422))
async def remove_price(
    gpu_model: GpuModel, provider: ProviderPrincipal, replica: ReplicaDep
) -> None:
    """Remove a model's price: its machines are listed without one for new work."""
    async with replica.db.write() as session:
        await prices.remove_price(session, provider.provider_id, gpu_model)
