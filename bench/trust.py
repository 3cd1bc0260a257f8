"""Trust at scale (issue 21 §9, docs/trust.md): cheaters among 1,000 simulated nodes.

Every node is a `SimulatedAgent` speaking the real agent protocol to an in-process
coordinator (SQLite in a temp file, a frozen clock moved by the bench): it registers,
answers its hardware challenge, leases and reports (`gpu_share.testing.trust_fleet`
builds the marketplace, `trust_ticks` moves its time, one job of 60 s a tick). 5 %
cheat, a fifth of them each way: every result made up; a tenth made up; failures
reported without running anything; an H100 claimed by a box without one; 500 honest
jobs, then made-up results. Honest nodes add the floating-point noise of other
hardware. Tenants' invokes ask for verified hardware; 8 trusted nodes of the platform
(8 GPUs each) run the checks.

Two schemes, the same nodes and cheaters, run side by side in two processes:
  adaptive  BOINC's adaptive replication, the defaults: start 0.5, halving every 10
            matches, floor 0.03
  fixed     the baseline: every job checked at the floor rate, 0.03, from the start
Reported for each: the cheaters caught within their first 200 fabricated results (or
faked failures), the jobs and the fabricated results until caught (p50/p99), fake
hardware rented (must be 0), false positives (honest nodes failing a challenge,
quarantined, with incidents, refunds or mismatches: must be 0), check compute over
tenant compute (the whole run; honest newcomers; at steady state: jobs answered
honestly by nodes whose rate is within 5 % of the floor — veterans, and turncoats before
they turn), and tenant money paid to cheaters and not refunded, as a share of all
tenant spend. Ratios: fixed ÷ adaptive time to catch, adaptive ÷ fixed compute.

Honest nodes arrive over the first 100 ticks and run `--jobs` jobs each; `--veterans`
of them run `--veteran-jobs` (long enough to reach the floor); cheaters run until
caught or their budget: 200 fabricated results (after 500 honest ones for the
turncoats). `--challenged` honest nodes answer a real challenge, the others are written
verified as a pass leaves them (the cheaters and the trusted nodes always answer). The
spot-check draws come from `random.Random(--seed)` in place of the loop's system
random, so a run with a seed repeats.

Run: .venv/bin/python bench/trust.py [--nodes 1000] [--jobs 2] [--seed 1] [--quick]
     [--serial] [--scheme adaptive|fixed|both]     (~10 min on 2 cores)
"""

import argparse
import asyncio
import concurrent.futures
import math
import multiprocessing
import os
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from pydantic import SecretStr
from sqlalchemy import select

from gpu_share.coordinator import migrate
from gpu_share.coordinator.app import create_app
from gpu_share.coordinator.core.orm import InvokeRow, NodeRow, TrustIncidentRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.money import ledger
from gpu_share.coordinator.services.trust import spot_checks
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import TEST_ADMIN_KEY
from gpu_share.testing.trust_fleet import (
    STRATEGIES,
    TRUSTED_GPUS,
    Fleet,
    FleetConfig,
    make_fleet,
    prove_hardware,
)
from gpu_share.testing.trust_ticks import run_ticks

SCHEMES = {"adaptive": (0.5, 0.03), "fixed": (0.03, 0.03)}  # start, floor


def log(scheme: str, text: str) -> None:
    print(f"[{scheme}] {text}", file=sys.stderr, flush=True)


async def rentals_of_fake_hardware(fleet: Fleet) -> dict[str, int]:
    """Each fake-hardware node, online, as a tenant would try to rent it: in the offers
    (verified only, the default; and with `include_unverified`), and reserved by id."""
    fakes = [n for n in fleet.nodes if n.kind == "fake_hardware"]
    for node in fakes:
        await node.agent.heartbeat()
    ids = {n.agent.node_id for n in fakes}
    tenant = fleet.tenants[0]
    shown = {}
    for unverified in (False, True):
        answer = await fleet.client.get(
            "/v1/offers",
            params={"limit": 200, "include_unverified": str(unverified).lower()},
            headers=tenant.headers,
        )
        assert answer.status_code == 200, answer.text
        shown[unverified] = sum(1 for offer in answer.json() if offer["node_id"] in ids)
    reserved = 0
    for node in fakes:
        answer = await fleet.client.post(
            "/v1/reservations",
            json={"node_id": node.agent.node_id, "hours": 1},
            headers=tenant.headers,
        )
        reserved += answer.status_code == 201
    return {
        "nodes": len(fakes),
        "challenge_failed": sum(1 for n in fakes if n.agent.node_id in fleet.challenge_failures),
        "jobs_leased": sum(n.leased_unverified for n in fakes),
        "in_offers": shown[False],
        "in_offers_with_unverified": shown[True],
        "reserved": reserved,
    }


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def seconds(row: InvokeRow) -> float:
    if row.started_at is None or row.finished_at is None:
        return 0.0
    return (row.finished_at - row.started_at).total_seconds()


async def measure(fleet: Fleet) -> dict[str, Any]:
    kind_of = {n.agent.node_id: n.kind for n in fleet.nodes}
    for agent in fleet.trusted:
        kind_of[agent.node_id] = "trusted"
    honest_ids = {i for i, k in kind_of.items() if k in ("honest", "veteran", "trusted")}
    cheater_ids = {n.agent.node_id for n in fleet.nodes if not n.honest}
    async with fleet.replica.db.read() as session:
        rows = (await session.scalars(select(InvokeRow))).all()
        incidents = (await session.scalars(select(TrustIncidentRow))).all()
        quarantined_ids = set(
            await session.scalars(select(NodeRow.id).where(NodeRow.quarantined_at.is_not(None)))
        )
        books = await ledger.books_total(session)
        held = 0
        for tenant in fleet.tenants:
            held += await ledger.balance(session, ledger.tenant_balance(tenant.id))
            held += await ledger.balance(session, ledger.tenant_reserved(tenant.id))
    jobs = [r for r in rows if r.check_of is None]
    checks = [r for r in rows if r.check_of is not None]
    by_id = {r.id: r for r in jobs}
    job_sec: defaultdict[str, float] = defaultdict(float)
    check_sec: defaultdict[str, float] = defaultdict(float)
    for row in jobs:
        job_sec[kind_of.get(row.node_id, "none")] += seconds(row)
    for check in checks:
        checked = by_id.get(check.check_of or "")
        kind = kind_of.get(checked.node_id if checked else None, "none")
        check_sec[kind] += seconds(check)
        if check.check_of in fleet.steady_ids:
            check_sec["steady"] += seconds(check)
        if check.check_of in fleet.turncoat_steady_ids:
            check_sec["turncoat_steady"] += seconds(check)
    for job_id in fleet.steady_ids:
        job_sec["steady"] += seconds(by_id[job_id])
    for job_id in fleet.turncoat_steady_ids:
        job_sec["turncoat_steady"] += seconds(by_id[job_id])

    def share(kinds: list[str]) -> float:
        spent = sum(job_sec[k] for k in kinds)
        return sum(check_sec[k] for k in kinds) / spent if spent else math.nan

    cost = sum(r.cost_micro or 0 for r in jobs)
    to_cheaters = [r for r in jobs if r.node_id in cheater_ids]
    lost = sum(r.cost_micro or 0 for r in to_cheaters if r.refunded_at is None)
    lost_made_up = sum(
        r.cost_micro or 0
        for r in to_cheaters
        if r.refunded_at is None and r.id in fleet.fabricated_ids
    )
    not_refunded = sum(r.cost_micro or 0 for r in jobs if r.refunded_at is None)
    honest_checks = [r for r in jobs if r.node_id in honest_ids and r.check_state]
    strategies: dict[str, Any] = {}
    for strategy in STRATEGIES:
        if strategy == "fake_hardware":
            continue
        group = [n for n in fleet.nodes if n.kind == strategy]
        caught = [n for n in group if n.caught_jobs is not None]
        strategies[strategy] = {
            "nodes": len(group),
            "caught": len(caught),
            "jobs_p50": percentile([n.caught_jobs or 0 for n in caught], 0.5),
            "jobs_p99": percentile([n.caught_jobs or 0 for n in caught], 0.99),
            "made_up_p50": percentile([n.caught_fabricated or 0 for n in caught], 0.5),
            "made_up_p99": percentile([n.caught_fabricated or 0 for n in caught], 0.99),
            "uncaught_made_up": sum(n.fabricated for n in group if n.caught_jobs is None),
        }
    cheats = [n for n in fleet.nodes if not n.honest and n.kind != "fake_hardware"]
    caught = [n for n in cheats if n.caught_jobs is not None]
    return {
        "ticks": fleet.ticks,
        "tenant_jobs": len(jobs),
        "checks": len(checks),
        "peak_checks_per_tick": fleet.peak_checks,
        "strategies": strategies,
        "cheaters": len(cheats),
        "caught": len(caught),
        "caught_within_budget": sum(
            1 for n in caught if (n.caught_fabricated or 0) <= fleet.config.budget
        ),
        "made_up_p50": percentile([n.caught_fabricated or 0 for n in caught], 0.5),
        "made_up_p99": percentile([n.caught_fabricated or 0 for n in caught], 0.99),
        "jobs_p50": percentile([n.caught_jobs or 0 for n in caught], 0.5),
        "jobs_p99": percentile([n.caught_jobs or 0 for n in caught], 0.99),
        "false_positives": {
            "challenges_failed": len(set(fleet.challenge_failures) & honest_ids),
            "quarantined": len(quarantined_ids & honest_ids),
            "incidents": sum(1 for i in incidents if i.node_id in honest_ids),
            "refunded_jobs": sum(1 for r in jobs if r.node_id in honest_ids and r.refunded_at),
            "mismatches": sum(1 for r in honest_checks if r.check_state == "mismatch"),
        },
        "honest_checks": dict(Counter(r.check_state for r in honest_checks)),
        "compute": {
            "all": share(list(set(job_sec) - {"steady", "turncoat_steady"})),
            "honest_newcomers": share(["honest"]),
            "veterans": share(["veteran"]),
            "steady": share(["steady"]),
            "steady_jobs": len(fleet.steady_ids),
            "steady_all": share(["steady", "turncoat_steady"]),
            "turncoats_before_turning_steady": share(["turncoat_steady"]),
            "turncoat_steady_jobs": len(fleet.turncoat_steady_ids),
        },
        "money": {
            "spend": cost,
            "to_cheaters": sum(r.cost_micro or 0 for r in to_cheaters),
            "lost": lost,
            "lost_made_up": lost_made_up,
            "lost_share": lost / cost if cost else math.nan,
            # Here cheaters do most of the work (honest nodes run a few jobs each): what
            # the share would be if they did 5 % of it, as 5 % of the nodes.
            "lost_share_at_5pct": (
                lost / sum(r.cost_micro or 0 for r in to_cheaters) * 0.05 if to_cheaters else 0.0
            ),
            "books_zero": books == (0, 0),
            "tenants_agree": held == 100_000_000_000 * len(fleet.tenants) - not_refunded,
        },
        "fake_hardware": await rentals_of_fake_hardware(fleet),
        "uncaught": await uncaught(fleet, jobs),
    }


async def uncaught(fleet: Fleet, jobs: list[InvokeRow]) -> list[dict[str, Any]]:
    """What the spot checks saw of each cheater they did not catch: its record, and how
    its made-up results were decided."""
    found = []
    for node in fleet.nodes:
        if node.honest or node.kind == "fake_hardware" or node.caught_jobs is not None:
            continue
        async with fleet.replica.db.read() as session:
            row = await session.get(NodeRow, node.agent.node_id)
        mine = [r for r in jobs if r.node_id == node.agent.node_id]
        found.append(
            {
                "kind": node.kind,
                "jobs": node.jobs,
                "made_up": node.fabricated,
                "record": (row.spot_checks or {}).get("runtimes") if row else None,
                "made_up_decided": dict(
                    Counter(r.check_state for r in mine if r.id in fleet.fabricated_ids)
                ),
            }
        )
    return found


async def run(scheme: str, config: FleetConfig) -> dict[str, Any]:
    start_rate, floor = SCHEMES[scheme]
    spot_checks._RANDOM = random.Random(config.seed)  # type: ignore[assignment]  # a run repeats
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-trust-") as folder:
        url = f"sqlite+aiosqlite:///{Path(folder) / 'trust.db'}"
        await migrate.upgrade(url)
        settings = Settings(
            data_dir=Path(folder) / "data",
            database_url=url,
            admin_key=SecretStr(TEST_ADMIN_KEY),
            run_background_loops=False,
            challenge_scale=1e-7,  # as the tests: the same protocol, chains of kilobytes
            challenge_memory_share=0.5,
            challenge_target_sec=0.05,
            spot_check_start_rate=start_rate,
            spot_check_floor_rate=floor,
        )
        clock = FrozenClock(datetime.now(UTC).replace(microsecond=0))
        app = create_app(settings, clock=clock)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
                fleet = await make_fleet(config, app, clock, c, lambda text: log(scheme, text))
                setup = time.perf_counter()
                await prove_hardware(fleet)
                challenged = time.perf_counter()
                await run_ticks(fleet)
                ran = time.perf_counter()
                results = await measure(fleet)
                for node in fleet.nodes:
                    await node.agent.aclose()
                for agent in fleet.trusted:
                    await agent.aclose()
    results["scheme"] = scheme
    results["load"] = os.getloadavg()[0]
    results["spent"] = dict(fleet.spent)
    results["wall_sec"] = {
        "register": setup - began,
        "challenges": challenged - setup,
        "jobs": ran - challenged,
        "all": time.perf_counter() - began,
    }
    return results


def run_scheme(scheme: str, config: FleetConfig) -> dict[str, Any]:
    return asyncio.run(run(scheme, config))


def _num(value: float | None, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "—" if value is None or math.isnan(value) else f"{100 * value:.2f} %"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or not a or not b or math.isnan(a) or math.isnan(b):
        return "—"
    return f"{a / b:.2f}"


def rows_of(result: dict[str, Any]) -> list[tuple[str, str]]:
    fp = result["false_positives"]
    compute = result["compute"]
    money = result["money"]
    hw = result["fake_hardware"]
    rows = [
        ("cheaters caught (no fake hardware)", f"{result['caught']}/{result['cheaters']}"),
        (
            "  within their first 200 made up",
            f"{result['caught_within_budget']}/{result['cheaters']}",
        ),
        (
            "  jobs until caught p50 / p99",
            f"{_num(result['jobs_p50'])} / {_num(result['jobs_p99'])}",
        ),
        (
            "  made-up results until caught p50 / p99",
            f"{_num(result['made_up_p50'])} / {_num(result['made_up_p99'])}",
        ),
    ]
    for strategy, s in result["strategies"].items():
        rows.append(
            (
                f"  {strategy}: caught, made up p50/p99, jobs p50/p99",
                f"{s['caught']}/{s['nodes']}, {_num(s['made_up_p50'])}/{_num(s['made_up_p99'])}, "
                f"{_num(s['jobs_p50'])}/{_num(s['jobs_p99'])}",
            )
        )
    rows += [
        (
            "fake hardware: challenge failed, jobs, offers, reserved",
            f"{hw['challenge_failed']}/{hw['nodes']}, {hw['jobs_leased']}, {hw['in_offers']} "
            f"(unverified shown: {hw['in_offers_with_unverified']}), {hw['reserved']}",
        ),
        (
            "false positives: challenges failed, quarantined, incidents, refunds, mismatches",
            f"{fp['challenges_failed']}, {fp['quarantined']}, {fp['incidents']}, "
            f"{fp['refunded_jobs']}, {fp['mismatches']}",
        ),
        (
            "honest checks by outcome",
            ", ".join(f"{k} {v}" for k, v in sorted(result["honest_checks"].items())),
        ),
        ("check compute ÷ tenant compute, whole run", _pct(compute["all"])),
        ("  honest newcomers", _pct(compute["honest_newcomers"])),
        (
            "  steady state: veterans near the floor (jobs)",
            f"{_pct(compute['steady'])} ({compute['steady_jobs']})",
        ),
        (
            "  turncoats' honest jobs near the floor (jobs)",
            f"{_pct(compute['turncoats_before_turning_steady'])} "
            f"({compute['turncoat_steady_jobs']})",
        ),
        ("  steady state, both together", _pct(compute["steady_all"])),
        ("tenant spend (USDC)", f"{money['spend'] / 1e6:.2f}"),
        ("  paid to cheaters", f"{money['to_cheaters'] / 1e6:.2f}"),
        (
            "  lost (paid to cheaters, not refunded)",
            f"{money['lost'] / 1e6:.2f} ({_pct(money['lost_share'])})",
        ),
        ("  of it for made-up results", f"{money['lost_made_up'] / 1e6:.2f}"),
        ("  lost if cheaters did 5 % of the work", _pct(money["lost_share_at_5pct"])),
        (
            "  books sum to zero; tenants' balances agree",
            f"{money['books_zero']}; {money['tenants_agree']}",
        ),
        (
            "tenant jobs, checks, peak checks in a tick",
            f"{result['tenant_jobs']}, {result['checks']}, {result['peak_checks_per_tick']}",
        ),
        (
            "wall time: register, challenges, jobs (s)",
            "{register:.0f}, {challenges:.0f}, {jobs:.0f}".format(**result["wall_sec"]),
        ),
    ]
    return rows


def goals(result: dict[str, Any]) -> list[tuple[str, bool]]:
    fp = result["false_positives"]
    hw = result["fake_hardware"]
    return [
        (
            "≥ 99 % of cheaters caught within 200 made up",
            result["caught_within_budget"] >= 0.99 * result["cheaters"],
        ),
        (
            "fake hardware caught before its first rental",
            hw["challenge_failed"] == hw["nodes"]
            and hw["jobs_leased"] == 0
            and hw["in_offers"] == 0
            and hw["reserved"] == 0,
        ),
        ("0 false positives", not any(fp.values())),
        ("≤ 5 % extra compute at steady state", result["compute"]["steady_all"] <= 0.05),
        ("≤ 0.5 % of tenant spend lost", result["money"]["lost_share"] <= 0.005),
        (
            "  … if cheaters did 5 % of the work",
            result["money"]["lost_share_at_5pct"] <= 0.005,
        ),
    ]


def report(results: dict[str, dict[str, Any]], config: FleetConfig) -> None:
    print(
        f"\ntrust bench: {config.nodes} nodes ({round(config.nodes * config.cheat_share)} "
        f"cheaters), {config.jobs} jobs per honest node, {config.veterans} veterans × "
        f"{config.veteran_jobs} jobs, {config.trusted} trusted nodes × {TRUSTED_GPUS} GPUs, "
        f"seed {config.seed}"
    )
    names = list(results)
    table = {name: dict(rows_of(results[name])) for name in names}
    width = max(len(label) for label in table[names[0]])
    print(f"{'':{width}}  " + "  ".join(f"{n:>34}" for n in names))
    for label in table[names[0]]:
        print(f"{label:{width}}  " + "  ".join(f"{table[n].get(label, ''):>34}" for n in names))
    if {"adaptive", "fixed"} <= set(names):
        a, f = results["adaptive"], results["fixed"]
        print("\nratios (fixed ÷ adaptive: how much longer the baseline lets a cheater work)")
        print(
            f"  jobs until caught p50: {_ratio(f['jobs_p50'], a['jobs_p50'])}, "
            f"p99: {_ratio(f['jobs_p99'], a['jobs_p99'])}"
        )
        print(
            f"  made-up until caught p50: {_ratio(f['made_up_p50'], a['made_up_p50'])}, "
            f"p99: {_ratio(f['made_up_p99'], a['made_up_p99'])}"
        )
        print(f"  money lost: {_ratio(f['money']['lost'], a['money']['lost'])}")
        print("ratios (adaptive ÷ fixed: what adaptivity costs)")
        print(
            f"  check compute, whole run: {_ratio(a['compute']['all'], f['compute']['all'])}, "
            f"steady state: {_ratio(a['compute']['steady_all'], f['compute']['steady_all'])}"
        )
    for name in names:
        for left in results[name]["uncaught"]:
            print(f"\nnot caught, {name}: {left}")
    for name in names:
        print(f"\ngoals, {name}:")
        for goal, met in goals(results[name]):
            print(f"  {'met   ' if met else 'MISSED'} {goal}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=FleetConfig.nodes)
    parser.add_argument("--jobs", type=int, default=FleetConfig.jobs, help="per honest node")
    parser.add_argument("--veterans", type=int, default=FleetConfig.veterans)
    parser.add_argument("--veteran-jobs", type=int, default=FleetConfig.veteran_jobs)
    parser.add_argument("--trusted", type=int, default=FleetConfig.trusted)
    parser.add_argument(
        "--challenged",
        type=int,
        default=FleetConfig.challenged,
        help="honest nodes answering a real challenge (the others are written verified)",
    )
    parser.add_argument("--seed", type=int, default=FleetConfig.seed)
    parser.add_argument("--scheme", choices=["both", *SCHEMES], default="both")
    parser.add_argument("--serial", action="store_true", help="one scheme after the other")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 100 nodes, veterans of 300 jobs, turncoats after 100",
    )
    args = parser.parse_args()
    config = FleetConfig(
        nodes=args.nodes,
        jobs=args.jobs,
        veterans=args.veterans,
        veteran_jobs=args.veteran_jobs,
        trusted=args.trusted,
        seed=args.seed,
    )
    if args.quick:
        config = FleetConfig(
            nodes=100,
            jobs=2,
            veterans=2,
            veteran_jobs=300,
            turn_after=100,
            trusted=2,
            arrival_ticks=20,
            seed=args.seed,
        )
    schemes = list(SCHEMES) if args.scheme == "both" else [args.scheme]
    began = time.perf_counter()
    if args.serial or len(schemes) == 1:
        results = {s: run_scheme(s, config) for s in schemes}
    else:
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(len(schemes), mp_context=context) as pool:
            futures = {s: pool.submit(run_scheme, s, config) for s in schemes}
            results = {s: f.result() for s, f in futures.items()}
    report(results, config)
    for name, result in results.items():
        spent = sorted(result["spent"].items(), key=lambda item: -item[1])
        print(f"load average (1 min) at the end, {name}: {result['load']:.1f}")
        print(
            f"where the jobs' time went, {name}: " + ", ".join(f"{k} {v:.0f} s" for k, v in spent)
        )
    print(f"\nwall time {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
