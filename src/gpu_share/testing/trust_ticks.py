"""Time for a `trust_fleet` marketplace, in ticks of one job (60 s by default): every
working node reports the job it held and leases its next one in the same request, the
tenants having submitted one job for each; the spot-check loop's pass runs (as often as
it takes to decide everything that ended); the trusted nodes lease the checks, which
they report the next tick. So a check concludes a tick after its job, a confirmation a
tick after that, and a cheater keeps working meanwhile, as it would.

Nodes heartbeat only at registration and their challenge: every lease and result marks
a node seen, and with no background loops no lease is swept. At a submit, only one
trusted node is online (it heartbeats): the submit reads every online node, two
statements each (`money/billing.plan_reserve`), which at 1,000 nodes costs a second.
"""

import hashlib
import time

from sqlalchemy import func, select

from gpu_share.coordinator.core.orm import InvokeRow, NodeRow
from gpu_share.coordinator.core.statuses import CheckState
from gpu_share.coordinator.loops import spot_checks as spot_check_loop
from gpu_share.coordinator.services.trust import spot_checks
from gpu_share.protocol import agent as wire
from gpu_share.testing.trust_fleet import RUNTIME, TRUSTED_GPUS, Fleet, Node


async def queued_tenant_jobs(fleet: Fleet) -> int:
    async with fleet.replica.db.read() as session:
        count = await session.scalar(
            select(func.count())
            .select_from(InvokeRow)
            .where(InvokeRow.status == "queued", InvokeRow.check_of.is_(None))
        )
    return int(count or 0)


async def submit(fleet: Fleet, count: int) -> None:
    """`count` tenants' jobs, each its own model and inputs, asking for verified hardware;
    one trusted node heartbeats first, so that one serving node is online (module doc)."""
    if count <= 0:
        return
    await fleet.trusted[0].heartbeat()
    for _ in range(count):
        fleet.jobs_made += 1
        n = fleet.jobs_made
        body = {
            "runtime": RUNTIME.value,
            "model_url": f"https://models.example.com/{n}.onnx",
            "model_checksum_sha256": hashlib.sha256(f"model {n}".encode()).hexdigest(),
            "inputs_url": f"https://data.example.com/{n}.npz",
            "inputs_checksum_sha256": hashlib.sha256(f"inputs {n}".encode()).hexdigest(),
            "timeout_sec": 600,
            "require_verified": True,
        }
        tenant = fleet.tenants[n % len(fleet.tenants)]
        answer = await fleet.client.post("/v1/gpu/invoke", json=body, headers=tenant.headers)
        assert answer.status_code == 202, answer.text


NEXT = wire.LeaseRequest(slots=1, free_gpus=1, wait_sec=0, start=True)


async def node_rates(fleet: Fleet, nodes: list[Node]) -> dict[str, float]:
    """The spot-check rate each node's next job is decided at."""
    ids = [n.agent.node_id for n in nodes]
    if not ids:
        return {}
    async with fleet.replica.db.read() as session:
        rows = (
            await session.execute(
                select(NodeRow.id, NodeRow.spot_checks).where(NodeRow.id.in_(ids))
            )
        ).all()
    rates = {}
    start = fleet.replica.settings.spot_check_start_rate
    for node_id, record in rows:
        entry = ((record or {}).get("runtimes") or {}).get(RUNTIME.value)
        rates[node_id] = float(entry["rate"]) if entry else start
    return rates


async def spot_pass(fleet: Fleet) -> bool:
    """As many of the loop's passes as it takes to decide and conclude everything;
    whether they queued work for the trusted nodes (checks, confirmations, or the jobs a
    node held when it was caught)."""
    queued = False
    while True:
        done = await spot_check_loop.run_once(fleet.replica)
        queued = queued or done.picked > 0
        queued = queued or any(c.state is CheckState.CONFIRMING or c.caught for c in done.concluded)
        if done.picked < spot_checks.BATCH and len(done.concluded) < spot_checks.BATCH:
            return queued


async def quarantined(fleet: Fleet) -> set[str]:
    async with fleet.replica.db.read() as session:
        rows = await session.scalars(select(NodeRow.id).where(NodeRow.quarantined_at.is_not(None)))
        return set(rows.all())


async def tick(fleet: Fleet, active: list[Node], arriving: list[Node]) -> list[Node]:
    """One job's time for everyone; the nodes still active after it."""
    config = fleet.config
    fleet.mark("other")
    fleet.clock.advance(config.job_sec)
    for index, agent in enumerate(fleet.trusted):
        for job in fleet.held_checks.pop(index, []):
            await agent.client.report(job.invoke_id, await fleet.trusted_answer[index](job), 0)
    fleet.mark("trusted report")
    working = [n for n in active if n.job is not None]
    going_on = [n for n in working if n.goes_on_after_this()]
    joining = arriving + [n for n in active if n.job is None and n.continues()]
    await submit(fleet, len(going_on) + len(joining) - await queued_tenant_jobs(fleet))
    fleet.mark("submit")
    steady_floor = fleet.replica.settings.spot_check_floor_rate * 1.05
    watched = [n for n in working if n.kind in ("veteran", "honest_then_fake")]
    rates = await node_rates(fleet, watched)
    fleet.mark("bench reads")
    for node in working:
        assert node.job is not None
        job = node.job
        report, made_up = await node.respond(job)
        node.jobs += 1
        if made_up:
            node.fabricated += 1
            fleet.fabricated_ids.add(job.invoke_id)
        if rates.get(node.agent.node_id or "", 1.0) <= steady_floor:
            if node.kind == "veteran":
                fleet.steady_ids.add(job.invoke_id)
            elif not made_up:
                fleet.turncoat_steady_ids.add(job.invoke_id)
        report.next = NEXT if node.continues() else None
        leased = await node.agent.client.report(job.invoke_id, report, retry_for=0)
        node.job = leased[0] if leased else None
    fleet.mark("report + next")
    for node in joining:
        leased = await node.agent.lease(slots=1, start=True)
        node.job = leased[0] if leased else None
    fleet.mark("lease")
    queued = await spot_pass(fleet)
    fleet.mark("spot-check pass")
    caught = await quarantined(fleet)
    fleet.mark("bench reads")
    still = []
    for node in active + arriving:
        if node.agent.node_id in caught:
            if node.caught_jobs is None:
                node.caught_jobs, node.caught_fabricated = node.jobs, node.fabricated
        elif node.job is not None or node.continues():
            still.append(node)
    if queued or fleet.checks_left:
        await lease_checks(fleet)
    fleet.mark("trusted lease")
    fleet.ticks += 1
    return still


async def lease_checks(fleet: Fleet) -> None:
    """The trusted nodes take the checks waiting, in turn from a rotating first one, until
    one finds fewer than it could take (the queue is empty: the others would find none)."""
    count = len(fleet.trusted)
    fleet.checks_left = True  # every trusted node full: some may wait for the next tick
    for turn in range(count):
        index = (fleet.ticks + turn) % count
        leased = await fleet.trusted[index].lease(
            slots=TRUSTED_GPUS, free_gpus=TRUSTED_GPUS, start=True
        )
        fleet.held_checks.setdefault(index, []).extend(leased)
        if len(leased) < TRUSTED_GPUS:
            fleet.checks_left = False
            break
    fleet.peak_checks = max(fleet.peak_checks, sum(len(h) for h in fleet.held_checks.values()))


async def run_ticks(fleet: Fleet) -> None:
    """Every node works until it stops or is caught; then the checks still running end."""
    pending = [n for n in fleet.nodes if n.kind != "fake_hardware"]
    pending.sort(key=lambda n: n.join_tick)
    fake_hardware = [n for n in fleet.nodes if n.kind == "fake_hardware"]
    active: list[Node] = []
    started = time.perf_counter()
    step = 0
    while pending or active:
        arriving = [n for n in pending if n.join_tick <= step]
        pending = pending[len(arriving) :]
        if step == 0:  # the first jobs, before any time passes
            await submit(fleet, len(arriving))
            for node in arriving:
                leased = await node.agent.lease(slots=1, start=True)
                node.job = leased[0] if leased else None
            active, arriving = arriving, []
            await lease_checks(fleet)
        active = await tick(fleet, active, arriving)
        if step < 10:  # fake hardware keeps asking for work, verdict or not
            for node in fake_hardware:
                node.leased_unverified += len(await node.agent.lease(slots=1, start=True))
            fleet.mark("fake hardware")
        step += 1
        if step % 50 == 0:
            fleet.progress(
                f"tick {step}: {len(active)} nodes working, {fleet.jobs_made} jobs "
                f"({time.perf_counter() - started:.0f} s)",
            )
    # Jobs left with quarantined nodes were requeued: the trusted fleet ran them. Drain
    # the checks still running, and those their conclusions start.
    for _ in range(6):
        fleet.clock.advance(fleet.config.job_sec)
        for index, agent in enumerate(fleet.trusted):
            for job in fleet.held_checks.pop(index, []):
                await agent.client.report(
                    job.invoke_id, await fleet.trusted_answer[index](job), retry_for=0
                )
        await spot_pass(fleet)
        await lease_checks(fleet)
    caught = await quarantined(fleet)
    for node in fleet.nodes:
        if node.agent.node_id in caught and node.caught_jobs is None:
            node.caught_jobs, node.caught_fabricated = node.jobs, node.fabricated
