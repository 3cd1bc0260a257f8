"""What invokes cost (SPEC §4.3, §4.4; docs/billing.md): reserve at submit, meter, settle.

- At submit (prepaid billing), the most an invoke can cost is moved from the tenant's
  balance to its reserve in the transaction that creates it: `timeout_sec` at the
  highest on-demand hourly rate among the online nodes that could serve it (spot work
  too), or the tenant's `max_cost` if lower. The per-GPU-hour rate that reserve
  covers joins the request's own `max_price_per_gpu_hour`, so placement
  (`placement.unmet`) only hands it to a node whose rate fits what was reserved.
- When a node takes it, the rate is fixed: the node's hourly rate × max(gpus, 1).
- It is metered from `started_at` to `finished_at`, per millisecond, rounded down to
  the micro-USDC, never past `timeout_sec` and never above the reserve. Failures on
  the provider's side (`PROVIDER_SIDE`, the reliability score's definition) cost
  nothing; a requeued invoke is metered for its final attempt only (a requeue clears
  `started_at`), except for the progress a preempted spot attempt kept.
- A preempted attempt (`charge_preempted`, at its requeue) is metered from its start to
  its last uploaded checkpoint, the work the next attempt resumes from; what ran after
  that checkpoint is lost to the preemption and costs nothing, and an attempt that
  saved none (a checkpoint that is not its runtime's is refused, never saved; ONNX jobs
  keep none) costs nothing. One CHARGE per attempt, cause
  ``invoke:{id}:attempt:{n}:preempted``, taken from the reserve; the settlement then
  charges the final attempt from what is left of it.
- `settle` runs in the transaction of the final status change (`invoke_state` calls
  it): one CHARGE (reserve → the provider's held earnings, commission, the rest back to
  the balance; `post_charge`, which every charge goes through, records the hold) or
  one RELEASE, under the cause ``invoke:{id}:settle``, posted once whatever retries.
"""

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import Row, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core import driver_models
from gpu_share.coordinator.core.db import driver_of
from gpu_share.coordinator.core.driver_sql import Row as DriverRow
from gpu_share.coordinator.core.driver_sql import Sql
from gpu_share.coordinator.core.orm import ArtifactRow, InvokeRow, LedgerTransactionRow, NodeRow
from gpu_share.coordinator.core.settings import BillingMode, Settings
from gpu_share.coordinator.services.money import earnings_hold, ledger, spending_limits
from gpu_share.coordinator.services.money.ledger import ChargeDetails, TransactionKind
from gpu_share.coordinator.services.nodes import prices
from gpu_share.coordinator.services.nodes.placement import Requirements, serves
from gpu_share.coordinator.services.nodes.prices import CPU_MODEL
from gpu_share.coordinator.services.providers.reliability_formula import PROVIDER_SIDE
from gpu_share.protocol.money import usdc_text
from gpu_share.protocol.runtimes import RuntimeName

MS_PER_HOUR = 3_600_000


def units(gpus: int) -> int:
    """GPUs billed: a CPU job (gpus 0) is billed as one unit."""
    return max(gpus, 1)


def metered(rate_micro_per_hour: int, milliseconds: int) -> int:
    """Per-second metering, rounded down to the micro-USDC."""
    return rate_micro_per_hour * max(milliseconds, 0) // MS_PER_HOUR


def most_for(rate_micro_per_hour: int, seconds: int) -> int:
    """The most `seconds` can cost at this rate, rounded up: what a reserve must hold."""
    return -(-rate_micro_per_hour * seconds // 3600)


def rate_cap(reserved_micro: int, seconds: int, gpus: int) -> int:
    """The highest per-GPU-hour rate whose `seconds` of `units(gpus)` fit the reserve."""
    return reserved_micro * 3600 // (max(seconds, 1) * units(gpus))


def reserve_cause(invoke_id: str) -> str:
    return f"invoke:{invoke_id}:reserve"


def settle_cause(invoke_id: str) -> str:
    return f"invoke:{invoke_id}:settle"


def preempted_cause(invoke_id: str, attempt: int) -> str:
    return f"invoke:{invoke_id}:attempt:{attempt}:preempted"


async def preempted_charges(session: AsyncSession, invoke_id: str, attempts: int) -> int:
    """What the invoke's preempted attempts (of its first `attempts`) were charged so far
    (`charge_preempted`); looked up by exact cause, so by the ledger's unique index."""
    causes = [preempted_cause(invoke_id, n) for n in range(1, attempts + 1)]
    if not causes:
        return 0
    found = await session.scalars(
        select(LedgerTransactionRow.details).where(LedgerTransactionRow.cause.in_(causes))
    )
    return sum(int((details or {}).get("cost_micro", 0)) for details in found)


def gpu_model_of(node: NodeRow, gpus: int) -> str:
    return str(node.gpus[0].get("model")) if gpus and node.gpus else CPU_MODEL


async def plan_reserve(
    session: AsyncSession,
    req: Requirements,
    *,
    timeout_sec: int,
    max_cost_micro: int | None,
    serving: list[NodeRow],
    now: datetime,
) -> tuple[int, Requirements]:
    """(what to reserve, the requirements placement must meet to stay within it).

    `serving`: the online nodes that meet `req`. When the reserve is 0 and no cap was
    asked for, placement is left as asked: nothing was reserved, so nothing can be
    charged, whoever takes it.

    Spot work is reserved and capped at on-demand rates too: placement knows a node by
    its on-demand rate (`NodeRow.price_per_gpu_hour_micro`), and a spot rate is never
    above it. It is charged at the spot rate; the difference comes back at settlement."""
    gpus = req.gpus if req.runtime.needs_gpu else 0
    rates = prices.on_demand_rates(serving)
    most = most_for(max(rates.values(), default=0) * units(gpus), timeout_sec)
    reserve = most if max_cost_micro is None else min(most, max_cost_micro)
    if reserve == 0 and max_cost_micro is None:
        return 0, req
    cap = rate_cap(reserve, timeout_sec, gpus)
    if req.max_price_micro is not None:
        cap = min(cap, req.max_price_micro)
    capped = replace(req, max_price_micro=cap)
    # One node that fits is enough (at 1,000 online, a submit weighed every one again).
    fits = any(rates[n.id] <= cap and serves(n, capped, now) for n in serving)
    return (reserve if fits else -1), capped


async def reserve_invoke(
    session: AsyncSession, row: InvokeRow, amount_micro: int, settings: Settings, now: datetime
) -> None:
    """Hold `amount_micro` of the tenant's balance for the invoke (402, changing nothing,
    when the balance cannot cover it or it would pass the tenant's monthly cap). The
    commission in force now is kept with it."""
    row.reserved_micro = amount_micro
    if amount_micro <= 0:
        return
    await spending_limits.reserve(
        session,
        tenant_id=row.tenant_id,
        amount_micro=amount_micro,
        cause=reserve_cause(row.id),
        details={
            "tenant_id": row.tenant_id,
            "work": "invoke",
            "work_id": row.id,
            "commission_bps": settings.commission_bps,
        },
        settings=settings,
        now=now,
        new_work="this invoke may cost up to",
    )


async def placed_rate(session: AsyncSession, node: NodeRow, *, gpus: int, spot: bool) -> int:
    """The rate fixed on work when `node` takes it: per hour, all its billed GPUs."""
    return await prices.hourly_rate(session, node, spot=spot) * units(gpus)


DEFAULT_COMMISSION_BPS: int = Settings.model_fields["commission_bps"].default


_POSTED_DETAILS = Sql(
    "SELECT details FROM ledger_transactions WHERE cause = :cause", jsons=("details",)
)


async def commission_of(session: AsyncSession, reserve_cause: str) -> int:
    """The commission in force when the money was reserved (kept with the RESERVE): work
    accepted under one commission is charged under it. On the driver (`driver_sql`):
    every paid job's charge reads it."""
    tx = await driver_of(session)
    posted = await tx.fetchrow(_POSTED_DETAILS, cause=reserve_cause)
    details = posted["details"] if posted is not None else None
    found = (details or {}).get("commission_bps")
    return int(found) if isinstance(found, int) else DEFAULT_COMMISSION_BPS


SETTLED_COLUMNS = (
    InvokeRow.id,
    InvokeRow.tenant_id,
    InvokeRow.node_id,
    InvokeRow.runtime,
    InvokeRow.priority,
    InvokeRow.gpus,
    InvokeRow.timeout_sec,
    InvokeRow.started_at,
    InvokeRow.finished_at,
    InvokeRow.error_code,
    InvokeRow.reserved_micro,
    InvokeRow.rate_micro_per_hour,
    InvokeRow.cost_micro,
    InvokeRow.attempts,
    InvokeRow.preemptions,
)
"""What `settle` reads of a final invoke: `invoke_state` has the UPDATE that makes it
final return them (`RETURNING`), so settling costs no read of its own."""

SETTLED_NAMES = tuple(column.key for column in SETTLED_COLUMNS)
"""Their names, for the statements written on the driver (`driver_sql`)."""


@dataclass(frozen=True, slots=True)
class Settled:
    """A final invoke as `settle` reads it, from a driver row of `SETTLED_NAMES` (and its
    `webhook_url`, which the caller tells)."""

    id: str
    tenant_id: str
    node_id: str | None
    runtime: str
    priority: str
    gpus: int
    timeout_sec: int
    started_at: datetime | None
    finished_at: datetime | None
    error_code: str | None
    reserved_micro: int
    rate_micro_per_hour: int | None
    cost_micro: int | None
    attempts: int
    preemptions: int
    webhook_url: str | None

    @classmethod
    def of(cls, row: DriverRow) -> "Settled":
        return cls(*(row[name] for name in (*SETTLED_NAMES, "webhook_url")))


_COST = Sql("UPDATE invokes SET cost_micro = :cost WHERE id = :invoke")
_NODE = driver_models.whole_row(NodeRow, "WHERE nodes.id = :node_id")

_PROVIDER_SIDE_CODES = frozenset(code.value for code in PROVIDER_SIDE)


def billed_ms(
    started_at: datetime | None,
    finished_at: datetime | None,
    timeout_sec: int,
    error_code: str | None,
    node_id: str | None,
) -> int:
    """The milliseconds an attempt is charged for: its run, at most its timeout; none for
    a failure on the provider's side (`PROVIDER_SIDE`) or work no node ran."""
    if error_code in _PROVIDER_SIDE_CODES or node_id is None:
        return 0
    if started_at is None or finished_at is None:
        return 0
    elapsed = finished_at - started_at
    return min(int(elapsed.total_seconds() * 1000), timeout_sec * 1000)


def cost_at_finish(
    *,
    reserved_micro: int,
    rate_micro_per_hour: int | None,
    preemptions: int,
    timeout_sec: int,
    started_at: datetime,
    finished_at: datetime,
    error_code: str | None,
    node_id: str,
) -> int | None:
    """The cost `settle` will find for an invoke made final with these values, for the
    statement that makes it final to write with the verdict (one round trip less on every
    job's end). None where it takes a read of the ledger (the charges of preempted
    attempts): `settle` writes it then. `settle` stays the owner: it computes the cost
    again from what the statement returned and writes it where the two differ."""
    if reserved_micro and preemptions:
        return None
    ms = billed_ms(started_at, finished_at, timeout_sec, error_code, node_id)
    return int(min(metered(rate_micro_per_hour or 0, ms), reserved_micro))


async def settle(session: AsyncSession, row: Row[*tuple[Any, ...]] | Settled, now: datetime) -> int:
    """Charge or release a final invoke's reserve, once; returns its cost.

    Called by `invoke_state` in the transaction that makes the invoke final, with the
    invoke as that UPDATE left it (`SETTLED_COLUMNS`)."""
    invoke_id: str = row.id
    if row.cost_micro is not None and row.reserved_micro == 0:
        return int(row.cost_micro)  # free mode: it was "0" from the start
    charged = (
        await preempted_charges(session, invoke_id, row.attempts)
        if row.reserved_micro and row.preemptions
        else 0
    )
    left = row.reserved_micro - charged  # what the preempted attempts left of the reserve
    rate = row.rate_micro_per_hour or 0
    ms = billed_ms(row.started_at, row.finished_at, row.timeout_sec, row.error_code, row.node_id)
    cost = int(min(metered(rate, ms), left))
    if row.cost_micro != charged + cost:  # else written with the verdict (`cost_at_finish`)
        tx = await driver_of(session)  # every job is settled: on the driver (`driver_sql`)
        await tx.execute(_COST, invoke=invoke_id, cost=charged + cost)
    if row.reserved_micro == 0:
        return cost
    tenant = row.tenant_id
    if cost == 0:
        await ledger.post(
            session,
            cause=settle_cause(invoke_id),
            kind=TransactionKind.RELEASE,
            entries=ledger.transfer(
                ledger.tenant_reserved(tenant), ledger.tenant_balance(tenant), left
            ),
            now=now,
            details={"tenant_id": tenant, "work": "invoke", "work_id": invoke_id},
        )
        return charged
    # Every paid job's charge reads its node: on the driver, as a row in no session.
    found = await (await driver_of(session)).fetchrow(_NODE, node_id=row.node_id)
    assert found is not None and row.started_at is not None and row.finished_at is not None
    node = driver_models.transient(NodeRow, found)
    bps = await commission_of(session, reserve_cause(invoke_id))
    provider_share, commission = ledger.split_commission(cost, bps)
    details: ChargeDetails = {
        "tenant_id": tenant,
        "provider_id": node.provider_id,
        "node_id": node.id,
        "work": "invoke",
        "work_id": invoke_id,
        "runtime": row.runtime,
        "gpu_model": gpu_model_of(node, row.gpus),
        "gpus": units(row.gpus),
        "spot": row.priority == "spot",
        "seconds": ms / 1000,
        "rate_micro_per_hour": rate,
        "cost_micro": cost,
        "provider_micro": provider_share,
        "commission_micro": commission,
        "started_at": row.started_at.isoformat(),
        "ended_at": row.finished_at.isoformat(),
    }
    await post_charge(
        session,
        cause=settle_cause(invoke_id),
        node=node,
        from_reserve=left,
        details=details,
        now=now,
    )
    return charged + cost


async def charge_preempted(
    session: AsyncSession,
    invoke_id: str,
    *,
    attempt: int,
    node_id: str,
    started_at: datetime | None,
    now: datetime,
) -> int:
    """Charge a preempted attempt for the progress it kept, once; returns the cost.

    Called by `invoke_state.requeue_preempted` in the requeue's transaction: from the
    attempt's start to the checkpoint it last uploaded (the next attempt resumes there),
    never past `timeout_sec`, never above what is left of the reserve. Only this cost
    leaves the reserve: the rest stays held for the attempts to come. A checkpoint is
    stored only once its runtime's format checks pass (`work/checkpoint_formats`), so
    junk bytes are never one; inference keeps none, and its lost attempts cost nothing."""
    row = (
        await session.execute(
            select(
                InvokeRow.tenant_id,
                InvokeRow.runtime,
                InvokeRow.priority,
                InvokeRow.gpus,
                InvokeRow.timeout_sec,
                InvokeRow.reserved_micro,
                InvokeRow.rate_micro_per_hour,
                ArtifactRow.created_at.label("checkpoint_at"),
            )
            .outerjoin(ArtifactRow, ArtifactRow.id == InvokeRow.checkpoint_artifact_id)
            .where(InvokeRow.id == invoke_id)
        )
    ).one()
    saved_at = row.checkpoint_at
    if RuntimeName(row.runtime).kind != "train":
        return 0  # inference keeps no checkpoint: nothing of a lost attempt is kept
    if row.reserved_micro == 0 or started_at is None or saved_at is None or saved_at <= started_at:
        return 0  # nothing reserved, never started, or no progress kept from this attempt
    ms = min(int((saved_at - started_at).total_seconds() * 1000), row.timeout_sec * 1000)
    left = row.reserved_micro - await preempted_charges(session, invoke_id, attempt)
    cost = int(min(metered(row.rate_micro_per_hour or 0, ms), left))
    node = await session.get(NodeRow, node_id)
    if cost <= 0 or node is None:
        return 0
    bps = await commission_of(session, reserve_cause(invoke_id))
    provider_share, commission = ledger.split_commission(cost, bps)
    details: ChargeDetails = {
        "tenant_id": row.tenant_id,
        "provider_id": node.provider_id,
        "node_id": node.id,
        "work": "invoke",
        "work_id": invoke_id,
        "runtime": row.runtime,
        "gpu_model": gpu_model_of(node, row.gpus),
        "gpus": units(row.gpus),
        "spot": row.priority == "spot",
        "seconds": ms / 1000,
        "rate_micro_per_hour": row.rate_micro_per_hour or 0,
        "cost_micro": cost,
        "provider_micro": provider_share,
        "commission_micro": commission,
        "started_at": started_at.isoformat(),
        "ended_at": saved_at.isoformat(),
    }
    posted = await post_charge(
        session,
        cause=preempted_cause(invoke_id, attempt),
        node=node,
        from_reserve=cost,
        details=details,
        now=now,
    )
    return cost if posted else 0


async def post_charge(
    session: AsyncSession,
    *,
    cause: str,
    node: NodeRow,
    from_reserve: int,
    details: ChargeDetails,
    now: datetime,
) -> bool:
    """Post the CHARGE of `details` for `cause`, once, taking `from_reserve` out of the
    tenant's reserve, and hold the provider's share (`earnings_hold`) until it can be
    trusted. False, changing nothing, when `cause` was posted before."""
    posted = await ledger.post(
        session,
        cause=cause,
        kind=TransactionKind.CHARGE,
        entries=charge_entries(
            details["tenant_id"],
            node.provider_id,
            from_reserve,
            details["cost_micro"],
            details["commission_micro"],
        ),
        now=now,
        details=details,
    )
    if posted:
        await earnings_hold.hold_charge(session, cause, node, details["provider_micro"])
    return posted


def charge_entries(
    tenant_id: str, provider_id: str, from_reserve: int, cost: int, commission: int
) -> list[ledger.Entry]:
    """`from_reserve` out of the tenant's reserve: the cost to the provider's held
    earnings (less the commission) and the platform, the rest back to the tenant's
    balance."""
    entries = [
        ledger.Entry(ledger.tenant_reserved(tenant_id), -from_reserve),
        ledger.Entry(ledger.provider_held(provider_id), cost - commission),
        ledger.Entry(ledger.COMMISSION, commission),
    ]
    if from_reserve > cost:
        entries.append(ledger.Entry(ledger.tenant_balance(tenant_id), from_reserve - cost))
    return entries


def cost_text(micro: int | None) -> str | None:
    return None if micro is None else usdc_text(micro)


def prepaid(settings: Settings) -> bool:
    return settings.billing is BillingMode.PREPAID


def demo_money(settings: Settings) -> bool:
    """Whether balances and prices here are `gpu-share up`'s demo money (pages say so)."""
    return settings.demo_money and prepaid(settings)
