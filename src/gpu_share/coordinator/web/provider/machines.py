"""The provider's dashboard (SPEC §5): their machines with live status and telemetry, what
hardware challenges proved of them (against what their application declared) and the
names the provider gives them, the enrollment tokens their agents register with, and the
tabs later work fills (benchmarks, pricing, earnings, payouts, performance)."""

from datetime import timedelta

from fastapi import APIRouter
from fastapi.responses import Response

from gpu_share.coordinator.core.errors import NotFound
from gpu_share.coordinator.http.replica import public_url
from gpu_share.coordinator.services.nodes import nodes
from gpu_share.coordinator.services.providers import declared_hardware, providers
from gpu_share.coordinator.services.trust import challenge_status
from gpu_share.coordinator.services.work import reservation_holds
from gpu_share.coordinator.web import enrollment
from gpu_share.coordinator.web.pages import Browser, SignedProvider, form_of, text
from gpu_share.protocol.names import NODE_LABEL_MAX, display_text
from gpu_share.protocol.providers import IssuedEnrollmentToken, ProviderNode

router = APIRouter(prefix="/provider", include_in_schema=False)

HISTORY = timedelta(minutes=15)
LIVE_EVERY_SEC = 5

# The tabs and, until their issue lands, what each honestly says it does not have yet.
TABS: dict[str, tuple[str, str, str]] = {}


Challenges = dict[str, dict[str, challenge_status.LatestChallenge]]


async def _machines(browser: Browser, provider_id: str) -> tuple[list[ProviderNode], Challenges]:
    """The machines, and the latest challenge of each of their GPUs (or CPUs)."""
    replica = browser.replica
    async with replica.db.read() as session:
        found = await nodes.of_provider(
            session, provider_id, browser.now(), replica.settings, history=HISTORY
        )
        reserved = await reservation_holds.reserved_indices_by_node(session, browser.now())
        challenges = await challenge_status.latest_by_target(session, [m.id for m in found])
    machines = [m.model_copy(update={"reserved_gpus": reserved.get(m.id, [])}) for m in found]
    return machines, challenges


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


async def machines_view(
    browser: Browser,
    provider_id: str,
    *,
    issued: IssuedEnrollmentToken | None = None,
    token_errors: dict[str, str] | None = None,
    label_error: tuple[str, str, str] | None = None,
    status: int = 200,
) -> Response:
    """The page, with an enrollment token just issued (shown this once) or a refusal (of a
    token, or of a machine's name: `label_error` is the node, the name typed, why)."""
    async with browser.replica.db.read() as session:
        account = await providers.get(session, provider_id)
        hardware = await declared_hardware.of_provider(session, provider_id)
    machines, challenges = await _machines(browser, provider_id)
    tokens = await enrollment.section(
        browser,
        provider_id,
        forms_at="/provider/enrollment-tokens",
        ask_lifetime=False,
        issued=issued,
        errors=token_errors,
    )
    return browser.render(
        "provider/machines.html",
        status=status,
        account=account,
        hardware=hardware,
        machines=machines,
        challenges=challenges,
        charts={m.id: charts(m) for m in machines},
        live_every=LIVE_EVERY_SEC,
        base=public_url(browser.replica),
        label_error=label_error,
        **tokens,
    )


@router.get("")
async def machines(signed: SignedProvider) -> Response:
    browser, provider = signed
    return await machines_view(browser, provider.provider_id)


@router.get("/machines.part")
async def machines_fragment(signed: SignedProvider) -> Response:
    """The machines list alone, for the page's live refresh."""
    browser, provider = signed
    machines, challenges = await _machines(browser, provider.provider_id)
    return browser.render(
        "provider/_machines.html",
        machines=machines,
        challenges=challenges,
        charts={m.id: charts(m) for m in machines},
        base=public_url(browser.replica),
    )


@router.post("/machines/{node_id}/label")
async def save_label(node_id: str, signed: SignedProvider) -> Response:
    """Name a machine; an empty name clears it (pages show its hostname again)."""
    browser, provider = signed
    form = await form_of(browser)
    entered = text(form, "label")
    try:
        label = display_text(entered, max_length=NODE_LABEL_MAX) if entered else None
    except ValueError as error:
        return await machines_view(
            browser,
            provider.provider_id,
            label_error=(node_id, entered, f"Name: {error}."),
            status=422,
        )
    try:
        async with browser.replica.db.write() as session:
            saved = await nodes.set_label(
                session,
                provider.provider_id,
                node_id,
                label,
                browser.now(),
                browser.replica.settings,
            )
    except NotFound:
        return browser.render(
            "public/message.html",
            status=404,
            title="No such machine",
            message="You have no machine with that id.",
        )
    said = (
        f"{saved.hostname} is now called {label}."
        if label
        else f"{saved.hostname} has no name now."
    )
    return browser.redirect(f"/provider#machine-{node_id}", flash=said)


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
