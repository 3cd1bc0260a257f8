"""SPEC §1.5 from the tenant's side, against simulated agents speaking the real protocol."""

import asyncio
import contextlib
import hashlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import event
from sqlalchemy.orm import ORMExecuteState, Session

from gpu_share.coordinator.core.settings import ChecksumMode, Settings
from gpu_share.examples import DIGITS_INPUTS, DIGITS_MODEL
from gpu_share.protocol.nodes import SandboxKind
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import HELLO_WORLD, TenantHandle
from gpu_share.testing.models import identity_model
from gpu_share.testing.simulated_agent import H100, AgentFactory, done_report, inventory

CPU_HELLO = {**HELLO_WORLD, "runtime": "onnx_cpu"}


async def invoke(
    client: httpx.AsyncClient, tenant: TenantHandle, body: dict[str, Any], **headers: str
) -> httpx.Response:
    return await client.post("/v1/gpu/invoke", json=body, headers={**tenant.headers, **headers})


async def test_seed_hello_world_without_a_gpu_node_is_503_no_capacity(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    await sim_agent(inventory(runtimes=[RuntimeName.ONNX_CPU]))
    response = await invoke(client, tenant, HELLO_WORLD)
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "NO_CAPACITY"
    assert "the one machine online does not run onnx_cuda" in error["message"]
    assert "Try onnx_cpu, which runs on CPUs, or try again later." in error["message"]


async def test_seed_hello_world_verbatim_is_queued_on_a_gpu_node(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    await sim_agent(inventory(runtimes=[RuntimeName.ONNX_CUDA, RuntimeName.ONNX_CPU], gpus=[H100]))
    response = await invoke(client, tenant, HELLO_WORLD)
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["id"].startswith("inv_")
    assert body["status"] == "queued"
    assert (body["runtime"], body["timeout_sec"], body["inputs_url"]) == ("onnx_cuda", 600, "")
    assert body["warnings"] == ["model_checksum_sha256 not given: the download is not verified"]
    fetched = await client.get(f"/v1/gpu/invokes/{body['id']}", headers=tenant.headers)
    assert fetched.json()["status"] == "queued"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"runtime": "tensorflow_gpu"}, "runtime"),
        ({"model_url": "not a url"}, "model_url"),
        ({"model_url": "file:///etc/passwd"}, "model_url"),
        ({"model_url": "ftp://example.com/m.onnx"}, "model_url"),
        ({"model_url": "https://user:pw@example.com/m.onnx"}, "model_url"),
        ({"inputs_url": "gopher://x"}, "inputs_url"),
        ({"model_checksum_sha256": "xyz"}, "model_checksum_sha256"),
        ({"timeout_sec": 0}, "timeout_sec"),
        ({"timeout_sec": 10**9}, "timeout_sec"),
        ({"timeout_sec": "ten"}, "timeout_sec"),
        ({"priority": "urgent"}, "priority"),
        ({"gpus": 0}, "gpus"),
        ({"unknown_field": 1}, "unknown_field"),
        ({"outputs_upload": {"url": "https://x.example/o", "method": "POST"}}, "outputs_upload"),
        (
            {"outputs_upload": {"url": "https://x.example/o", "headers": {"Host": "evil"}}},
            "outputs_upload",
        ),
    ],
)
async def test_invalid_invoke_is_422_naming_the_field(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    change: dict[str, Any],
    field: str,
) -> None:
    await sim_agent()
    response = await invoke(client, tenant, {**CPU_HELLO, **change})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "VALIDATION_ERROR"
    assert field in error["message"]


async def test_missing_required_fields_are_named(
    client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    response = await invoke(client, tenant, {"inputs_url": ""})
    assert response.status_code == 422
    locs = {tuple(d["loc"]) for d in response.json()["error"]["details"]}
    assert {("body", "runtime"), ("body", "model_url")} <= locs


async def test_idempotency_key_replays_and_refuses_a_different_body(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    await sim_agent()
    first = await invoke(client, tenant, CPU_HELLO, **{"Idempotency-Key": "k-1"})
    again = await invoke(client, tenant, CPU_HELLO, **{"Idempotency-Key": "k-1"})
    assert first.status_code == again.status_code == 202
    assert first.json()["id"] == again.json()["id"]
    assert again.headers["idempotent-replayed"] == "true"
    other = await invoke(
        client, tenant, {**CPU_HELLO, "timeout_sec": 60}, **{"Idempotency-Key": "k-1"}
    )
    assert other.status_code == 409
    assert "Idempotency-Key" in other.json()["error"]["message"]
    listed = (await client.get("/v1/gpu/invokes", headers=tenant.headers)).json()["items"]
    assert len(listed) == 1


async def test_concurrent_requests_with_one_idempotency_key_make_one_invoke(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    await sim_agent()
    responses = await asyncio.gather(
        *(invoke(client, tenant, CPU_HELLO, **{"Idempotency-Key": "same"}) for _ in range(5))
    )
    assert {r.status_code for r in responses} == {202}
    assert len({r.json()["id"] for r in responses}) == 1


async def test_idempotency_keys_are_per_tenant(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    sim_agent: AgentFactory,
) -> None:
    await sim_agent()
    mine = await invoke(client, tenant, CPU_HELLO, **{"Idempotency-Key": "k"})
    theirs = await invoke(client, other_tenant, CPU_HELLO, **{"Idempotency-Key": "k"})
    assert mine.json()["id"] != theirs.json()["id"]


async def test_enforce_mode_requires_checksums(
    client: httpx.AsyncClient, tenant: TenantHandle, settings: Settings, sim_agent: AgentFactory
) -> None:
    await sim_agent()
    settings.checksum_mode = ChecksumMode.ENFORCE
    response = await invoke(client, tenant, CPU_HELLO)
    assert response.status_code == 422
    assert "model_checksum_sha256" in response.json()["error"]["message"]
    with_inputs = {
        **CPU_HELLO,
        "model_checksum_sha256": "a" * 64,
        "inputs_url": "https://example.com/in.npz",
    }
    response = await invoke(client, tenant, with_inputs)
    assert response.status_code == 422
    assert "inputs_checksum_sha256" in response.json()["error"]["message"]
    ok = await invoke(client, tenant, {**with_inputs, "inputs_checksum_sha256": "b" * 64})
    assert ok.status_code == 202
    assert ok.json()["warnings"] == []


@contextlib.contextmanager
def orm_statements() -> Iterator[list[str]]:
    """The statements the ORM runs in the block, any session's: the hot paths (a submit,
    a lease) run theirs on the driver (`driver_sql`)."""
    statements: list[str] = []

    def on_execute(state: ORMExecuteState) -> None:
        statements.append(str(state.statement))

    event.listen(Session, "do_orm_execute", on_execute)
    try:
        yield statements
    finally:
        event.remove(Session, "do_orm_execute", on_execute)


async def upload(client: httpx.AsyncClient, tenant: TenantHandle, data: bytes) -> dict[str, Any]:
    response = await client.post(
        "/v1/artifacts", params={"kind": "model"}, content=data, headers=tenant.headers
    )
    assert response.status_code == 201
    body: dict[str, Any] = response.json()
    return body


async def test_platform_artifact_urls_are_checked_at_submission(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
    settings: Settings,
) -> None:
    await sim_agent()
    mine = await upload(client, tenant, identity_model("mine"))
    theirs = await upload(client, other_tenant, identity_model("theirs"))

    not_yours = await invoke(client, tenant, {**CPU_HELLO, "model_url": theirs["url"]})
    assert not_yours.status_code == 404
    wrong_sum = await invoke(
        client, tenant, {**CPU_HELLO, "model_url": mine["url"], "model_checksum_sha256": "0" * 64}
    )
    assert wrong_sum.status_code == 422
    assert wrong_sum.json()["error"]["code"] == "CHECKSUM_MISMATCH"
    good = await invoke(
        client,
        tenant,
        {
            **CPU_HELLO,
            "model_url": mine["url"],
            "model_checksum_sha256": hashlib.sha256(identity_model("mine")).hexdigest(),
        },
    )
    assert good.status_code == 202
    clock.advance(settings.artifact_ttl_sec + 1)
    expired = await invoke(client, tenant, {**CPU_HELLO, "model_url": mine["url"]})
    assert expired.status_code == 410
    assert expired.json()["error"]["code"] == "ARTIFACT_EXPIRED"


async def test_other_tenants_invoke_is_404_everywhere(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    sim_agent: AgentFactory,
) -> None:
    await sim_agent()
    invoke_id = (await invoke(client, tenant, CPU_HELLO)).json()["id"]
    for method, path in [
        ("GET", f"/v1/gpu/invokes/{invoke_id}"),
        ("GET", f"/v1/gpu/invokes/{invoke_id}/logs"),
        ("POST", f"/v1/gpu/invokes/{invoke_id}/cancel"),
    ]:
        response = await client.request(method, path, headers=other_tenant.headers)
        assert response.status_code == 404, path
    assert (await client.get("/v1/gpu/invokes", headers=other_tenant.headers)).json()["items"] == []


async def test_listing_filters_by_status_and_pages(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent()
    ids = [(await invoke(client, tenant, CPU_HELLO)).json()["id"] for _ in range(3)]
    (job,) = await agent.lease()
    await agent.complete(job)
    done = await client.get("/v1/gpu/invokes", params={"status": "done"}, headers=tenant.headers)
    assert [i["id"] for i in done.json()["items"]] == [ids[0]]
    page = (await client.get("/v1/gpu/invokes", params={"limit": 2}, headers=tenant.headers)).json()
    assert [i["id"] for i in page["items"]] == [ids[2], ids[1]]
    rest = await client.get(
        "/v1/gpu/invokes",
        params={"limit": 2, "cursor": page["next_cursor"]},
        headers=tenant.headers,
    )
    assert [i["id"] for i in rest.json()["items"]] == [ids[0]]
    bad = await client.get("/v1/gpu/invokes", params={"status": "sleeping"}, headers=tenant.headers)
    assert bad.status_code == 422


@pytest.mark.parametrize(
    "cursor", ["zzz", "inv_!!", "art_01m8vd018gwwcbvxqcmy5f5chn", "inv_" + "u" * 26]
)
async def test_a_cursor_the_api_did_not_give_out_is_422_not_an_empty_page(
    client: httpx.AsyncClient, tenant: TenantHandle, cursor: str
) -> None:
    response = await client.get(
        "/v1/gpu/invokes", params={"cursor": cursor}, headers=tenant.headers
    )
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["details"][0]["loc"] == ["cursor"]
    assert "next_cursor" in error["message"]


async def test_wait_answers_as_soon_as_the_invoke_is_final(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent()
    invoke_id = (await invoke(client, tenant, CPU_HELLO)).json()["id"]
    (job,) = await agent.lease()
    await agent.client.start(job.invoke_id, job.lease_token)
    waiting = asyncio.create_task(
        client.get(f"/v1/gpu/invokes/{invoke_id}", params={"wait": 60}, headers=tenant.headers)
    )
    await asyncio.sleep(0.2)
    assert not waiting.done()  # still running: the long-poll holds
    await agent.client.report(job.invoke_id, done_report(job), retry_for=0)
    answer = await asyncio.wait_for(waiting, 30)  # not the 60 s asked for
    assert answer.json()["status"] == "done"


async def test_wait_answers_with_the_current_state_when_it_runs_out(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    await sim_agent()
    invoke_id = (await invoke(client, tenant, CPU_HELLO)).json()["id"]
    answer = await client.get(
        f"/v1/gpu/invokes/{invoke_id}", params={"wait": 0.3}, headers=tenant.headers
    )
    assert answer.status_code == 200 and answer.json()["status"] == "queued"
    too_long = await client.get(
        f"/v1/gpu/invokes/{invoke_id}", params={"wait": 61}, headers=tenant.headers
    )
    assert too_long.status_code == 422


async def test_wait_for_a_canceled_queued_invoke_ends_at_once(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    await sim_agent()
    invoke_id = (await invoke(client, tenant, CPU_HELLO)).json()["id"]
    waiting = asyncio.create_task(
        client.get(f"/v1/gpu/invokes/{invoke_id}", params={"wait": 60}, headers=tenant.headers)
    )
    await asyncio.sleep(0.2)
    await client.post(f"/v1/gpu/invokes/{invoke_id}/cancel", headers=tenant.headers)
    answer = await asyncio.wait_for(waiting, 30)
    assert answer.json()["status"] == "canceled"


async def test_cancel_of_a_queued_invoke_is_immediate_and_final(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent()
    invoke_id = (await invoke(client, tenant, CPU_HELLO)).json()["id"]
    canceled = await client.post(f"/v1/gpu/invokes/{invoke_id}/cancel", headers=tenant.headers)
    assert canceled.json()["status"] == "canceled"
    assert canceled.json()["error"]["code"] == "CANCELED"
    assert await agent.lease() == []
    again = await client.post(f"/v1/gpu/invokes/{invoke_id}/cancel", headers=tenant.headers)
    assert again.status_code == 200


async def test_cancel_of_a_running_invoke_reaches_the_agent(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    from gpu_share.protocol.agent import LeaseVerdict, ResultReport
    from gpu_share.protocol.invokes import InvokeError, InvokeStatus

    agent = await sim_agent()
    invoke_id = (await invoke(client, tenant, CPU_HELLO)).json()["id"]
    (job,) = await agent.lease()
    await agent.client.start(job.invoke_id, job.lease_token)
    asked = await client.post(f"/v1/gpu/invokes/{invoke_id}/cancel", headers=tenant.headers)
    assert asked.json()["status"] == "running"
    assert asked.json()["cancel_requested_at"] is not None
    ack = await agent.heartbeat([job])
    assert ack.leases[0].verdict is LeaseVerdict.CANCEL
    await agent.client.report(
        job.invoke_id,
        ResultReport(
            lease_token=job.lease_token,
            status=InvokeStatus.CANCELED,
            error=InvokeError(code="CANCELED", message="canceled by the tenant"),
        ),
        retry_for=0,
    )
    final = (await client.get(f"/v1/gpu/invokes/{invoke_id}", headers=tenant.headers)).json()
    assert final["status"] == "canceled"
    done_cancel = await client.post(f"/v1/gpu/invokes/{invoke_id}/cancel", headers=tenant.headers)
    assert done_cancel.status_code == 200


async def test_cancel_after_done_is_409(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent()
    invoke_id = (await invoke(client, tenant, CPU_HELLO)).json()["id"]
    (job,) = await agent.lease()
    await agent.complete(job)
    response = await client.post(f"/v1/gpu/invokes/{invoke_id}/cancel", headers=tenant.headers)
    assert response.status_code == 409


async def test_logs_are_readable_while_running_with_a_cursor(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent()
    invoke_id = (await invoke(client, tenant, CPU_HELLO)).json()["id"]
    (job,) = await agent.lease()
    await agent.client.start(job.invoke_id, job.lease_token)
    await agent.client.append_logs(job.invoke_id, job.lease_token, "loading model\n")
    first = await client.get(f"/v1/gpu/invokes/{invoke_id}/logs", headers=tenant.headers)
    assert first.text == "loading model\n"
    assert first.headers["x-invoke-status"] == "running"
    await agent.client.append_logs(job.invoke_id, job.lease_token, "ran in 3 ms\n")
    more = await client.get(
        f"/v1/gpu/invokes/{invoke_id}/logs",
        params={"after": first.headers["x-log-cursor"]},
        headers=tenant.headers,
    )
    assert more.text == "ran in 3 ms\n"


async def test_log_size_is_capped_per_invoke(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory, settings: Settings
) -> None:
    settings.max_log_bytes_per_invoke = 100
    agent = await sim_agent()
    invoke_id = (await invoke(client, tenant, CPU_HELLO)).json()["id"]
    (job,) = await agent.lease()
    for _ in range(5):
        await agent.client.append_logs(job.invoke_id, job.lease_token, "x" * 60)
    text = (await client.get(f"/v1/gpu/invokes/{invoke_id}/logs", headers=tenant.headers)).text
    assert text.count("x") == 100
    assert text.endswith("[log truncated: size limit reached]\n")


async def test_constraints_limit_which_nodes_count_as_capacity(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    await sim_agent(
        inventory(runtimes=[RuntimeName.ONNX_CUDA], gpus=[H100], region="eu-west"), verified=True
    )
    base = {**HELLO_WORLD}
    assert (
        await invoke(client, tenant, {**base, "gpu_model": "H100", "min_vram_gb": 80})
    ).status_code == 202
    assert (await invoke(client, tenant, {**base, "gpu_model": "A100"})).status_code == 503
    assert (await invoke(client, tenant, {**base, "min_vram_gb": 96})).status_code == 503
    assert (await invoke(client, tenant, {**base, "region": "EU-WEST"})).status_code == 202
    assert (await invoke(client, tenant, {**base, "region": "us-east"})).status_code == 503
    assert (await invoke(client, tenant, {**base, "gpus": 2})).status_code == 503
    assert (await invoke(client, tenant, {**base, "tier": "enterprise"})).status_code == 503
    assert (await invoke(client, tenant, {**base, "priority": "spot"})).status_code == 202


async def test_webhook_url_is_refused_until_the_account_has_a_signing_secret(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    """docs/webhooks.md; the deliveries themselves: tests/coordinator/services/webhooks."""
    await sim_agent()
    response = await invoke(
        client, tenant, {**CPU_HELLO, "webhook_url": "https://example.com/hook"}
    )
    assert response.status_code == 422
    assert response.json()["error"]["message"].startswith(
        "webhook_url: your account has no webhook signing secret yet"
    )


async def test_isolated_only_keeps_work_off_nodes_that_run_plain_processes(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    plain = await sim_agent(inventory(sandbox=SandboxKind.PROCESS))
    nodes = (await client.get("/v1/nodes", headers=tenant.headers)).json()
    assert [(n["sandbox"], n["isolated"]) for n in nodes] == [("process", False)]
    refused = await invoke(client, tenant, {**CPU_HELLO, "isolated_only": True})
    assert refused.status_code == 503
    assert "isolated_only" in refused.json()["error"]["message"]

    sandboxed = await sim_agent(inventory(sandbox=SandboxKind.BWRAP))
    queued = await invoke(client, tenant, {**CPU_HELLO, "isolated_only": True})
    assert queued.status_code == 202
    assert await plain.lease() == []
    assert [job.invoke_id for job in await sandboxed.lease()] == [queued.json()["id"]]


async def test_a_submit_resolves_its_platform_artifacts_without_the_orm(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    # Both files are the tenant's uploads, read on the driver with their blobs
    # (`artifact_refs.stored_artifact`): the submit stays clear of the ORM.
    await sim_agent(inventory(runtimes=[RuntimeName.ONNX_CPU]))
    model = await upload(client, tenant, DIGITS_MODEL.read_bytes())
    inputs = (
        await client.post(
            "/v1/artifacts",
            params={"kind": "inputs"},
            content=DIGITS_INPUTS.read_bytes(),
            headers=tenant.headers,
        )
    ).json()
    body = {**CPU_HELLO, "model_url": model["url"], "inputs_url": inputs["url"]}
    with orm_statements() as statements:
        response = await invoke(client, tenant, body)
    assert response.status_code == 202, response.text
    assert statements == []
