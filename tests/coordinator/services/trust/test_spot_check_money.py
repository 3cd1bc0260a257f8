"""What catches do to the books (docs/trust.md, "When a node is caught"), on SQLite and
PostgreSQL, as a property: whatever the order of charges (invokes, sessions), releases of
held earnings, catches and sweeps, the books sum to zero, no account that holds someone's
money goes below zero, and once the refunds have run no tenant pays for work of a
quarantined node that was still in its hold when the node was caught or came after."""

import asyncio
import itertools
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.orm import (
    EarningsHoldRow,
    InvokeRow,
    LedgerAccountRow,
    LedgerTransactionRow,
    NodeRow,
    ProviderRow,
    TenantRow,
)
from gpu_share.coordinator.services.money import billing, earnings_hold, ledger
from gpu_share.coordinator.services.money.earnings_hold import HoldPolicy
from gpu_share.coordinator.services.money.ledger import ChargeDetails, TransactionKind
from gpu_share.coordinator.services.trust import consequences
from gpu_share.protocol.invokes import InvokeStatus

T0 = datetime(2027, 3, 1, 9, tzinfo=UTC)
HOLD = HoldPolicy(standard=timedelta(days=7), verified_enterprise=timedelta(days=2))
NODES = 4  # two providers with two nodes each: a second catch of one suspends it
TENANTS = 2
TOP_UP = 10_000_000

steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("charge"),
            st.integers(0, NODES - 1),
            st.integers(0, TENANTS - 1),
            st.integers(1, 200_000),
            st.sampled_from(["invoke", "session"]),
        ),
        st.tuples(st.just("wait"), st.integers(1, 4 * 86_400)),
        st.just(("release",)),
        st.tuples(st.just("catch"), st.integers(0, NODES - 1)),
        st.just(("sweep",)),
    ),
    min_size=1,
    max_size=16,
)
_run = itertools.count()


@dataclass
class World:
    run: int
    now: datetime
    nodes: list[str] = field(default_factory=list)
    providers: list[str] = field(default_factory=list)
    tenants: list[str] = field(default_factory=list)
    charges: list[tuple[str, str, str, int, datetime]] = field(default_factory=list)
    caught_at: dict[str, datetime] = field(default_factory=dict)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sequence=steps)
def test_no_tenant_pays_a_quarantined_node_and_the_books_stay_sound(
    db_url: str, sequence: list[tuple[object, ...]]
) -> None:
    asyncio.run(_check(db_url, sequence, next(_run)))


async def _check(url: str, sequence: list[tuple[object, ...]], run: int) -> None:
    db = Database(url)
    world = World(run, T0 + timedelta(days=400 * run))
    try:
        await _populate(db, world)
        for n, step in enumerate(sequence):
            match step:
                case ("charge", int(k), int(t), int(cost), str(work)):
                    await _charge(db, world, k, t, cost, work, n)
                case ("wait", int(seconds)):
                    world.now += timedelta(seconds=seconds)
                case ("release",):
                    async with db.write() as session:
                        await earnings_hold.release_due(session, world.now, HOLD)
                case ("catch", int(k)):
                    await _catch(db, world, k, n)
                case ("sweep",):
                    async with db.write() as session:
                        await consequences.refund_quarantined(session, world.now)
            await _assert_sound(db, world)
        async with db.write() as session:
            await consequences.refund_quarantined(session, world.now)
        await _assert_nobody_pays_a_quarantined_node(db, world)
    finally:
        await db.dispose()


async def _populate(db: Database, world: World) -> None:
    async with db.write() as session:
        for p in range(2):
            provider = f"prv_{world.run}_{p}"
            world.providers.append(provider)
            session.add(
                ProviderRow(
                    id=provider,
                    name=f"P{p}",
                    email=f"p{p}@example.com",
                    tier="community",
                    created_at=world.now,
                    offences=0,
                )
            )
        for t in range(TENANTS):
            tenant = f"ten_{world.run}_{t}"
            world.tenants.append(tenant)
            session.add(
                TenantRow(id=tenant, name=f"T{t}", email=f"t{t}@example.com", created_at=world.now)
            )
        await session.flush()
        for k in range(NODES):
            node = f"nod_{world.run}_{k}"
            world.nodes.append(node)
            session.add(
                NodeRow(
                    id=node,
                    provider_id=world.providers[k // 2],
                    hostname=f"n{k}",
                    agent_version="sim",
                    cpu_count=4,
                    ram_mb=1024,
                    gpus=[],
                    runtimes=["onnx_cpu"],
                    sandbox="process",
                    max_concurrent_jobs=1,
                    tier="community",
                    delisted=False,
                    registered_at=world.now,
                    trusted=False,
                )
            )
        for tenant in world.tenants:
            await ledger.post(
                session,
                cause=f"topup:{tenant}",
                kind=TransactionKind.TOP_UP,
                entries=ledger.transfer(ledger.WORLD, ledger.tenant_balance(tenant), TOP_UP),
                now=world.now,
            )


async def _charge(db: Database, world: World, k: int, t: int, cost: int, work: str, n: int) -> None:
    """A charge as billing posts it: reserved from the tenant's balance, then charged."""
    node_id, tenant = world.nodes[k], world.tenants[t]
    cause = f"{work}:w{world.run}_{n}:settle"
    async with db.write() as session:
        node = await session.get(NodeRow, node_id)
        assert node is not None
        balance = await ledger.balance(session, ledger.tenant_balance(tenant))
        if balance < cost:
            return
        await ledger.post(
            session,
            cause=f"{cause}:reserve",
            kind=TransactionKind.RESERVE,
            entries=ledger.transfer(
                ledger.tenant_balance(tenant), ledger.tenant_reserved(tenant), cost
            ),
            now=world.now,
        )
        provider_share, commission = ledger.split_commission(cost, 1500)
        details: ChargeDetails = {
            "tenant_id": tenant,
            "provider_id": node.provider_id,
            "node_id": node_id,
            "work": work,
            "work_id": f"w{world.run}_{n}",
            "runtime": "onnx_cpu",
            "gpu_model": "cpu",
            "gpus": 1,
            "spot": False,
            "seconds": 60.0,
            "rate_micro_per_hour": cost * 60,
            "cost_micro": cost,
            "provider_micro": provider_share,
            "commission_micro": commission,
            "started_at": world.now.isoformat(),
            "ended_at": world.now.isoformat(),
        }
        await billing.post_charge(
            session, cause=cause, node=node, from_reserve=cost, details=details, now=world.now
        )
    world.charges.append((cause, node_id, tenant, cost, world.now))


async def _catch(db: Database, world: World, k: int, n: int) -> None:
    node_id = world.nodes[k]
    checked = InvokeRow(id=f"inv_{world.run}_{n}", node_id=node_id, status="done", result=None)
    check = InvokeRow(id=f"inv_{world.run}_{n}c", node_id=None, status=InvokeStatus.DONE.value)
    async with db.write() as session:
        caught = await consequences.catch(
            session,
            checked=checked,
            check=check,
            kind=consequences.IncidentKind.RESULT_MISMATCH,
            evidence={"reason": "made up"},
            now=world.now,
            base_url="",
        )
    for node in caught.quarantined:
        world.caught_at.setdefault(node, world.now)


async def _assert_sound(db: Database, world: World) -> None:
    async with db.read() as session:
        assert await ledger.books_total(session) == (0, 0)
        lowest = await session.scalar(select(func.min(LedgerAccountRow.balance_micro)))
        assert lowest is None or lowest >= 0
        for provider_id in world.providers:
            held = await ledger.balance(session, ledger.provider_held(provider_id))
            in_holds = await session.scalar(
                select(func.coalesce(func.sum(EarningsHoldRow.amount_micro), 0)).where(
                    EarningsHoldRow.provider_id == provider_id
                )
            )
            assert held == in_holds


async def _assert_nobody_pays_a_quarantined_node(db: Database, world: World) -> None:
    async with db.read() as session:
        settled = dict(
            (
                await session.execute(
                    select(LedgerTransactionRow.cause, LedgerTransactionRow.kind).where(
                        LedgerTransactionRow.kind.in_(["hold_release", "refund"])
                    )
                )
            ).all()
        )
        charge_of = dict(
            (
                await session.execute(
                    select(LedgerTransactionRow.cause, LedgerTransactionRow.id).where(
                        LedgerTransactionRow.cause.in_([c[0] for c in world.charges] or [""])
                    )
                )
            ).all()
        )
        still_held = set(
            (
                await session.scalars(
                    select(EarningsHoldRow.node_id).where(
                        EarningsHoldRow.node_id.in_(list(world.caught_at) or [""])
                    )
                )
            ).all()
        )
        assert not still_held, "a quarantined node keeps earnings in their hold"
        paid = dict.fromkeys(world.tenants, 0)
        for cause, node_id, tenant, cost, at in world.charges:
            refunded = f"refund:{charge_of[cause]}" in settled
            released = f"hold_release:{charge_of[cause]}" in settled
            assert not (refunded and released)
            caught = world.caught_at.get(node_id)
            if caught is not None and not refunded:
                # paid only for work whose hold was over before its node was caught
                assert released and at + HOLD.standard <= caught, (cause, at, caught)
            if not refunded:
                paid[tenant] += cost
        for tenant in world.tenants:
            balance = await ledger.balance(session, ledger.tenant_balance(tenant))
            assert balance == TOP_UP - paid[tenant]
