"""What an invoke would cost if submitted now (`POST /v1/gpu/quote`, SPEC §4.4).

The node is the one placement would pick now: among the online nodes that serve the
request within what it would reserve, the best ranked (`ranking.rank`) that has a free
slot, else the best ranked busy one. `max_cost` is `timeout_sec` at that node's rate
(capped by the request's `max_cost`); `expected_cost` is the median metered time of
this tenant's last `HISTORY` finished invokes of the same model and runtime at that
rate (never above `max_cost`), or `max_cost` when there is no such history. `reserve`
is what submitting it would hold (spot work is held at on-demand rates, `billing`),
`covered` says whether the balance has it and `within_cap` whether it fits under the
tenant's monthly cap (`spending_limits`).
"""

from datetime import datetime
from statistics import median

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.orm import InvokeRow, NodeRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.money import billing, ledger, spending_limits
from gpu_share.coordinator.services.nodes import nodes, prices, ranking
from gpu_share.coordinator.services.nodes.placement import Requirements, requirements_of, serves
from gpu_share.coordinator.services.work import invokes
from gpu_share.protocol.billing import Quote
from gpu_share.protocol.invokes import InvokeCreate, InvokeStatus, Priority
from gpu_share.protocol.money import usdc_text

HISTORY = 20  # recent invokes of the same model the expected time is the median of


async def quote(
    session: AsyncSession,
    settings: Settings,
    tenant_id: str,
    body: InvokeCreate,
    *,
    origins: set[str],
    now: datetime,
) -> Quote:
    invokes.check_request(body, settings)
    model = await invokes.resolve_url(
        session, tenant_id, "model_url", body.model_url, body.model_checksum_sha256, origins, now
    )
    if body.inputs_url:
        await invokes.resolve_url(
            session,
            tenant_id,
            "inputs_url",
            body.inputs_url,
            body.inputs_checksum_sha256,
            origins,
            now,
        )
    req = requirements_of(body, body.gpus)
    reserve, placed = await invokes.reserve_plan(session, settings, body, req, now)
    spot = body.priority is Priority.SPOT
    node = await _pick(session, settings, placed, now=now)
    gpus = body.gpus if body.runtime.needs_gpu else 0
    units = billing.units(gpus)
    free = not billing.prepaid(settings)
    per_gpu = 0 if free else await prices.hourly_rate(session, node, spot=spot)
    rate = per_gpu * units
    most = billing.most_for(rate, body.timeout_sec)
    if body.max_cost is not None:
        most = min(most, body.max_cost)
    seconds = await _expected_seconds(session, tenant_id, body, model.sha256)
    basis = "history" if seconds is not None else "timeout"
    expected_sec = float(body.timeout_sec) if seconds is None else seconds
    expected = min(billing.metered(rate, int(expected_sec * 1000)), most)
    if seconds is None:
        expected = most
    available = await ledger.balance(session, ledger.tenant_balance(tenant_id))
    return Quote(
        billing=settings.billing,
        node_id=node.id,
        gpu_model=billing.gpu_model_of(node, gpus),
        units=units,
        rate_per_gpu_hour=usdc_text(per_gpu),
        rate_per_hour=usdc_text(rate),
        max_cost=usdc_text(most),
        reserve=usdc_text(reserve),
        expected_cost=usdc_text(expected),
        expected_seconds=round(expected_sec, 3),
        expected_basis=basis,
        available=usdc_text(available),
        covered=free or available >= reserve,
        within_cap=free or await spending_limits.fits(session, tenant_id, reserve, now),
    )


async def _pick(
    session: AsyncSession, settings: Settings, req: Requirements, *, now: datetime
) -> NodeRow:
    live = [n for n in await nodes.live_nodes(session, now, settings) if serves(n, req, now)]
    cap = req.max_price_micro
    if cap is not None and billing.prepaid(settings):
        rates = prices.on_demand_rates(live)
        live = [n for n in live if rates[n.id] <= cap] or live
    running = await nodes.running_counts(session)
    idle = [n for n in live if running.get(n.id, 0) < n.max_concurrent_jobs]
    return max(idle or live, key=ranking.rank)


async def _expected_seconds(
    session: AsyncSession, tenant_id: str, body: InvokeCreate, model_sha256: str | None
) -> float | None:
    same_model = (
        InvokeRow.model_sha256 == model_sha256
        if model_sha256 is not None
        else InvokeRow.model_url == body.model_url
    )
    rows = (
        await session.execute(
            select(InvokeRow.started_at, InvokeRow.finished_at)
            .where(
                InvokeRow.tenant_id == tenant_id,
                InvokeRow.runtime == body.runtime.value,
                InvokeRow.status == InvokeStatus.DONE.value,
                InvokeRow.started_at.is_not(None),
                InvokeRow.finished_at.is_not(None),
                same_model,
            )
            .order_by(InvokeRow.finished_at.desc())
            .limit(HISTORY)
        )
    ).all()
    spans = [
        min((end - start).total_seconds(), body.timeout_sec)
        for start, end in rows
        if start is not None and end is not None
    ]
    return float(median(spans)) if spans else None
