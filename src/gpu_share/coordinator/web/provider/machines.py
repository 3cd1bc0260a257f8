"""The provider's dashboard (SPEC §5): their machines with live status and telemetry, and
the tabs later work fills (benchmarks, pricing, earnings, payouts, performance)."""

from datetime import timedelta

from fastapi import APIRouter
from fastapi.responses import Response

from gpu_share.coordinator.http.replica import base_url
from gpu_share.coordinator.services.nodes import nodes
from gpu_share.coordinator.services.providers import providers
from gpu_share.coordinator.services.work import reservation_holds
from gpu_share.coordinator.web.pages import Browser, SignedProvider
from gpu_share.protocol.providers import ProviderNode

router = APIRouter(prefix="/provider", include_in_schema=False)

HISTORY = timedelta(minutes=15)
LIVE_EVERY_SEC = 5

# The tabs and, until their issue lands, what each honestly says it does not have yet.
TABS: dict[str, tuple[str, str, str]] = {}


async def _machines(browser: Browser, provider_id: str) -> list[ProviderNode]:
    replica = browser.replica
    async with replica.db.read() as session:
        found = await nodes.of_provider(
            session, provider_id, browser.now(), replica.settings, history=HISTORY
        )
        reserved = await reservation_holds.reserved_indices_by_node(session, browser.now())
    return [m.model_copy(update={"reserved_gpus": reserved.get(m.id, [])}) for m in found]


def charts(node: ProviderNode) -> dict[str, list[float | None]]:
    """Per GPU: utilization, memory used, temperature and power over the recent samples."""
    series: dict[str, list[float | None]] = {}
    for gpu in node.gpus:
        for name in ("utilization_pct", "memory_used_mb", "temperature_c", "power_w"):
            values: list[float | None] = []
            for sample in node.recent:
                reading = next((g for g in sample.gpus if g.index == gpu.index), None)
                value = getattr(reading, name) if reading is not None else None
                values.append(float(value) if value is not None else None)
            series[f"{gpu.index}:{name}"] = values
    series["cpu_pct"] = [s.cpu_pct for s in node.recent]
    series["ram_used_mb"] = [
        float(s.ram_used_mb) if s.ram_used_mb is not None else None for s in node.recent
    ]
    return series


@router.get("")
async def machines(signed: SignedProvider) -> Response:
    browser, provider = signed
    async with browser.replica.db.read() as session:
        account = await providers.get(session, provider.provider_id)
    machines = await _machines(browser, provider.provider_id)
    return browser.render(
        "provider/machines.html",
        account=account,
        machines=machines,
        charts={m.id: charts(m) for m in machines},
        live_every=LIVE_EVERY_SEC,
        base=base_url(browser.replica, browser.request),
    )


@router.get("/machines.part")
async def machines_fragment(signed: SignedProvider) -> Response:
    """The machines list alone, for the page's live refresh."""
    browser, provider = signed
    machines = await _machines(browser, provider.provider_id)
    return browser.render(
        "provider/_machines.html",
        machines=machines,
        charts={m.id: charts(m) for m in machines},
        base=base_url(browser.replica, browser.request),
    )


@router.get("/{tab}")
async def tab_page(tab: str, signed: SignedProvider) -> Response:
    browser, _provider = signed
    if tab not in TABS:
        return browser.render(
            "public/message.html", status=404, title="No such page", message="No such tab."
        )
    title, empty_title, empty_text = TABS[tab]
    return browser.render(
        "provider/tab.html",
        title=title,
        empty_title=empty_title,
        empty_text=empty_text,
    )
