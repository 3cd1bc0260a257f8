"""`GET /metrics`: who may scrape it, and that it says what the platform holds and did,
read with Prometheus' own parser; the Grafana dashboard in deploy/ asks only for what it
says."""

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from gpu_share.coordinator.app import create_app
from gpu_share.coordinator.core.clock import FrozenClock
from gpu_share.coordinator.core.settings import Settings
from gpu_share.testing.factories import ADMIN, HELLO_WORLD, TenantHandle, bearer
from gpu_share.testing.simulated_agent import AgentFactory, done_report

DASHBOARD = Path(__file__).resolve().parents[4] / "deploy" / "grafana" / "gpu-share.json"
CPU_HELLO = {**HELLO_WORLD, "runtime": "onnx_cpu"}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(client: httpx.AsyncClient, headers: dict[str, str] = ADMIN) -> Samples:
    answer = await client.get("/metrics", headers=headers)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def test_only_an_admin_key_scrapes_without_a_token(
    client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    missing = await client.get("/metrics")
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == "UNAUTHORIZED"
    refused = await client.get("/metrics", headers=tenant.headers)
    assert refused.status_code == 403
    assert "admin" in refused.json()["error"]["message"]
    await scrape(client)


@pytest.fixture
async def with_token(settings: Settings, clock: FrozenClock) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(
        settings.model_copy(update={"metrics_token": SecretStr("scrape-token-0123456789")}),
        clock=clock,
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            yield c


async def test_the_metrics_token_scrapes_and_a_wrong_one_does_not(
    with_token: httpx.AsyncClient,
) -> None:
    samples = await scrape(with_token, bearer("scrape-token-0123456789"))
    assert ("gpushare_invokes_queued", frozenset()) not in samples  # nothing queued yet
    wrong = await with_token.get("/metrics", headers=bearer("scrape-token-0123456788"))
    assert wrong.status_code == 401
    await scrape(with_token)  # an admin key still does


async def test_the_scrape_says_what_is_queued_online_done_and_held(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    before = await scrape(client)
    agent = await sim_agent()
    credited = await client.post(
        f"/v1/admin/tenants/{tenant.id}/top-ups",
        json={"amount": "2.5", "reference": "wire-metrics"},
        headers=ADMIN,
    )
    assert credited.status_code == 201, credited.text
    for body in (CPU_HELLO, {**CPU_HELLO, "tier": "community"}, CPU_HELLO):
        submitted = await client.post("/v1/gpu/invoke", json=body, headers=tenant.headers)
        assert submitted.status_code == 202, submitted.text
    queued = await scrape(client)
    queue = "gpushare_invokes_queued"
    assert value(queued, queue, runtime="onnx_cpu", priority="on_demand", tier="any") == 2
    assert value(queued, queue, runtime="onnx_cpu", priority="on_demand", tier="community") == 1
    assert value(queued, "gpushare_nodes_online", tier="community", verified="false") == 1
    assert value(queued, "gpushare_ledger_balance_micro_usdc", account="tenant_balance") == (
        2_500_000
    )
    assert value(queued, "gpushare_ledger_balance_micro_usdc", account="world") == -2_500_000
    posted = "gpushare_ledger_postings_total"
    assert value(queued, posted, kind="top_up") - value(before, posted, kind="top_up") == 1
    invoke = "gpushare_http_requests_total"
    labels = {"method": "POST", "route": "/v1/gpu/invoke", "status": "202"}
    assert value(queued, invoke, **labels) - value(before, invoke, **labels) == 3

    (job,) = await agent.lease(wait=0)
    leased = await scrape(client)
    assert value(leased, "gpushare_invokes_active", runtime="onnx_cpu", status="assigned") == 1
    assert sum(v for (name, _), v in leased.items() if name == queue) == 2
    await agent.client.report(job.invoke_id, done_report(job), retry_for=0)
    after = await scrape(client)
    ended = "gpushare_invokes_ended_total"
    assert value(after, ended, status="done") - value(before, ended, status="done") == 1
    claims = "gpushare_claim_seconds_count"
    assert value(after, claims) - value(before, claims) >= 1
    jobs = "gpushare_claimed_jobs_total"
    assert value(after, jobs) - value(before, jobs) == 1
    assert value(after, "gpushare_invokes_active", runtime="onnx_cpu", status="assigned") == 0
    lease = {"method": "POST", "route": "/v1/agent/lease", "status": "200"}
    assert value(after, invoke, **lease) - value(before, invoke, **lease) >= 1


async def test_stored_bytes_follow_uploads(client: httpx.AsyncClient, tenant: TenantHandle) -> None:
    config = json.dumps({"task": "regression", "iterations": 10, "depth": 4}).encode()
    for _ in range(2):  # the same content twice: two artifacts, stored once
        uploaded = await client.post(
            "/v1/artifacts", params={"kind": "config"}, content=config, headers=tenant.headers
        )
        assert uploaded.status_code == 201, uploaded.text
    samples = await scrape(client)
    assert value(samples, "gpushare_artifacts", kind="config") == 2
    assert value(samples, "gpushare_artifact_bytes", kind="config") == 2 * len(config)
    assert value(samples, "gpushare_stored_bytes") == len(config)


async def test_the_dashboard_asks_only_for_metrics_the_coordinator_exports(
    client: httpx.AsyncClient,
) -> None:
    answer = await client.get("/metrics", headers=ADMIN)
    exported = {family.name for family in text_string_to_metric_families(answer.text)}
    dashboard = json.loads(DASHBOARD.read_text())
    asked = {
        re.sub(r"_(bucket|count|sum|total)$", "", name)
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        for name in re.findall(r"gpushare_[a-z_]+", target["expr"])
    }
    assert asked, "the dashboard has no queries"
    assert asked <= exported, asked - exported
    unused = {name for name in exported if name.startswith("gpushare_")} - asked
    assert not unused, f"exported but on no panel: {unused}"
