"""The SDK against the real coordinator in-process (`transport=`), on both databases.

Agents here are simulated (the real agent protocol, no GPU): they let a test decide
what a job reports (`sdk` and `serving` are in conftest.py). The real agent process is
in tests/sdk/test_live.py.
"""

import asyncio
import hashlib
import io
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi import FastAPI

from gpu_share import (
    ArtifactExpired,
    AsyncClient,
    ChecksumMismatch,
    Client,
    ConfigurationError,
    Conflict,
    Forbidden,
    GpuShareError,
    InvokeCanceled,
    InvokeFailed,
    NoCapacity,
    NotFound,
    PayloadTooLarge,
    QuotaExceeded,
    Unauthorized,
    ValidationError,
    WaitTimeout,
)
from gpu_share.coordinator.core.settings import Settings
from gpu_share.protocol import agent as wire
from gpu_share.protocol.artifacts import Artifact
from gpu_share.protocol.invokes import Invoke, InvokeError, InvokeResult, InvokeStatus, Metrics
from gpu_share.protocol.nodes import Node, NodeStatus, RuntimeAvailability
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.sdk import RetryPolicy
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import ProviderHandle, TenantHandle
from gpu_share.testing.models import identity_model, padded_model
from gpu_share.testing.servers import serve
from gpu_share.testing.simulated_agent import AgentFactory, SimulatedAgent, done_report, npz_bytes

POLL = 0.02
RETRY = RetryPolicy(backoff_base=0.01)
MODEL = identity_model()
UNKNOWN_INVOKE = "inv_" + "0" * 26  # well formed (anything else is a 422), naming nothing


def outputs_npz(**arrays: object) -> bytes:
    return npz_bytes(**arrays)


# Discovery


async def test_health_needs_no_key(app: FastAPI) -> None:
    async with AsyncClient("http://testserver/", transport=httpx.ASGITransport(app=app)) as c:
        health = await c.health()
    assert (health.status, health.database, health.nodes_online) == ("ok", "ok", 0)


async def test_nodes_and_runtimes_come_as_the_protocol_models(
    sdk: AsyncClient, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent()
    nodes = await sdk.nodes()
    assert [type(n) for n in nodes] == [Node]
    assert (nodes[0].id, nodes[0].status) == (agent.node_id, NodeStatus.ONLINE)
    runtimes = {r.name.value: r for r in await sdk.runtimes()}
    assert isinstance(runtimes["onnx_cpu"], RuntimeAvailability)
    assert runtimes["onnx_cpu"].nodes_online == 1
    assert runtimes["onnx_cuda"].nodes_online == 0


async def test_probe_url_answers_with_the_agents_rules(sdk: AsyncClient) -> None:
    result = await sdk.probe_url("http://127.0.0.1:9/model.onnx")
    assert result.reachable is False
    assert result.error and "loopback" in result.error


# Artifacts


async def test_upload_from_bytes_path_and_file_reuses_the_identical_live_artifact(
    sdk: AsyncClient, tmp_path: Path
) -> None:
    first = await sdk.upload_artifact(MODEL, "model")
    assert isinstance(first, Artifact)
    assert (first.size, first.sha256) == (len(MODEL), hashlib.sha256(MODEL).hexdigest())
    path = tmp_path / "model.onnx"
    path.write_bytes(MODEL)
    assert (await sdk.upload_artifact(path, "model")).id == first.id
    with path.open("rb") as file:
        assert (await sdk.upload_artifact(file, "model")).id == first.id
    with pytest.raises(ValidationError, match="it is an ONNX model"):  # sent, not reused
        await sdk.upload_artifact(str(path), "inputs")
    fresh = await sdk.upload_artifact(io.BytesIO(MODEL), "model", reuse=False)
    assert fresh.id != first.id
    listed = await sdk.artifacts(kind="model")
    assert {a.id for a in listed.items} == {first.id, fresh.id}


async def test_an_upload_is_named_after_its_file_and_reuse_prefers_the_same_name(
    sdk: AsyncClient, tmp_path: Path
) -> None:
    path = tmp_path / "digits.onnx"
    path.write_bytes(MODEL)
    from_path = await sdk.upload_artifact(path, "model")
    assert from_path.name == "digits.onnx"
    assert (await sdk.upload_artifact(MODEL, "model", reuse=False)).name is None  # bare bytes
    with path.open("rb") as file:  # a file opened from a path knows its name
        assert (await sdk.upload_artifact(file, "model", reuse=False)).name == "digits.onnx"
    assert (await sdk.upload_artifact(io.BytesIO(MODEL), "model", reuse=False)).name is None

    # The same bytes under another name: an identical live artifact is reused, keeping
    # its name; one already under the name asked for is preferred.
    reused = await sdk.upload_artifact(MODEL, "model", name="other.onnx")
    assert reused.name != "other.onnx" and reused.sha256 == from_path.sha256
    renamed = await sdk.upload_artifact(MODEL, "model", name="v2/other.onnx", reuse=False)
    assert renamed.name == "other.onnx"  # the server drops the directory part
    assert (await sdk.upload_artifact(path, "model")).name == "digits.onnx"
    again = await sdk.upload_artifact(MODEL, "model", name="other.onnx")
    assert again.name == "other.onnx"


async def test_an_artifact_about_to_expire_is_uploaded_again(
    sdk: AsyncClient, clock: FrozenClock
) -> None:
    clock.advance(-23.5 * 3600)
    first = await sdk.upload_artifact(MODEL, "model")  # uploaded 23.5 hours ago
    clock.advance(23.5 * 3600)  # now: 30 minutes left, too little for a queued job
    second = await sdk.upload_artifact(MODEL, "model")
    assert second.id != first.id
    assert (await sdk.upload_artifact(MODEL, "model")).id == second.id


async def test_delete_artifact(sdk: AsyncClient) -> None:
    artifact = await sdk.upload_artifact(MODEL, "model")
    await sdk.delete_artifact(artifact.id)
    with pytest.raises(NotFound):
        await sdk.delete_artifact(artifact.id)


# Invoke and wait


async def test_invoke_and_wait_uploads_arrays_and_decodes_inline_outputs(
    sdk: AsyncClient, serving: Callable[..., Awaitable[SimulatedAgent]]
) -> None:
    seen: list[wire.LeasedJob] = []

    async def double(job: wire.LeasedJob) -> wire.ResultReport:
        seen.append(job)
        return done_report(job, outputs_npz(y=np.arange(4, dtype=np.float32) * 2))

    await serving(double)
    batch = {"x": np.arange(4, dtype=np.float32)}
    statuses: list[InvokeStatus] = []
    out = await sdk.invoke_and_wait(
        "onnx_cpu", MODEL, batch, on_status=lambda inv: statuses.append(inv.status)
    )
    np.testing.assert_array_equal(out["y"], [0, 2, 4, 6])
    assert out.keys() == ["y"] and out.metrics.device == "cpu"
    assert statuses[-1] is InvokeStatus.DONE
    job = seen[0]
    assert job.model.sha256 == hashlib.sha256(MODEL).hexdigest()  # checksum sent along
    assert job.inputs is not None and job.inputs.platform


async def test_invoke_and_wait_uploads_a_trainings_model_as_its_train_config(
    sdk: AsyncClient, serving: Callable[..., Awaitable[SimulatedAgent]]
) -> None:
    """A CatBoost training takes its train config as `model_url`: uploaded as a model it
    would be refused (a config is no ONNX model), so it goes as kind=config."""
    await serving(runtimes=[RuntimeName.CATBOOST_CPU])
    config = b'{"task": "regression", "iterations": 20}'
    data = {"X": np.zeros((4, 2), dtype=np.float32), "y": np.arange(4, dtype=np.float32)}
    out = await sdk.invoke_and_wait("catboost_cpu", config, data)
    assert out.invoke.status is InvokeStatus.DONE
    staged = await sdk.artifacts(kind="config")
    assert [a.sha256 for a in staged.items] == [hashlib.sha256(config).hexdigest()]
    assert (await sdk.artifacts(kind="model")).items == []


async def test_invoke_by_url_with_zero_inputs_then_wait_and_outputs(
    sdk: AsyncClient, serving: Callable[..., Awaitable[SimulatedAgent]]
) -> None:
    await serving()
    model = await sdk.upload_artifact(MODEL, "model")
    queued = await sdk.invoke("onnx_cpu", model.url, "", timeout_sec=60)
    assert isinstance(queued, Invoke) and queued.status is InvokeStatus.QUEUED
    done = await sdk.wait(queued.id, timeout=30)
    assert done.status is InvokeStatus.DONE
    outputs = await sdk.outputs(queued.id)
    assert outputs.raw == b""  # what the simulated agent reports by default
    page = await sdk.invokes(status="done")
    assert [i.id for i in page.items] == [queued.id]


async def test_large_outputs_are_fetched_from_the_platform_with_the_key(
    sdk: AsyncClient, serving: Callable[..., Awaitable[SimulatedAgent]], tmp_path: Path
) -> None:
    data = outputs_npz(big=np.ones((64, 64), dtype=np.float64))

    async def store(job: wire.LeasedJob) -> wire.ResultReport:
        path = tmp_path / "out.npz"
        path.write_bytes(data)
        sha = hashlib.sha256(data).hexdigest()
        stored = await agent.client.store_outputs(job.invoke_id, job.lease_token, path, sha)
        report = done_report(job, data)
        assert report.result is not None
        report.result.outputs_inline_base64, report.result.outputs_url = None, stored.url
        return report

    agent = await serving(store)
    out = await sdk.invoke_and_wait("onnx_cpu", MODEL)
    assert out.url is not None and out.raw == data
    assert out["big"].shape == (64, 64)


async def test_outputs_in_the_tenants_own_storage_come_back_as_a_url(
    sdk: AsyncClient, serving: Callable[..., Awaitable[SimulatedAgent]]
) -> None:
    async def elsewhere(job: wire.LeasedJob) -> wire.ResultReport:
        report = done_report(job, b"x" * 10)
        assert report.result is not None
        report.result.outputs_inline_base64 = None
        report.result.outputs_url = "https://bucket.example/outputs.npz"
        return report

    await serving(elsewhere)
    out = await sdk.invoke_and_wait(
        "onnx_cpu",
        MODEL,
        outputs_upload={"url": "https://bucket.example/outputs.npz?sig=1"},
    )
    assert (out.raw, out.url) == (None, "https://bucket.example/outputs.npz")
    with pytest.raises(GpuShareError, match="your own storage"):
        _ = out.arrays


async def test_a_failed_invoke_raises_with_its_code_message_and_log_tail(
    sdk: AsyncClient, serving: Callable[..., Awaitable[SimulatedAgent]]
) -> None:
    async def fail(job: wire.LeasedJob) -> wire.ResultReport:
        await agent.client.append_logs(
            job.invoke_id, job.lease_token, "loading model\nonnxruntime: bad graph\n"
        )
        return wire.ResultReport(
            lease_token=job.lease_token,
            status=InvokeStatus.FAILED,
            error=InvokeError(code="INVALID_MODEL", message="model_url is not a valid ONNX model"),
            result=InvokeResult(metrics=Metrics(device="cpu", duration_ms=1)),
        )

    agent = await serving(fail)
    with pytest.raises(InvokeFailed) as caught:
        await sdk.invoke_and_wait("onnx_cpu", MODEL)
    error = caught.value
    assert error.code == "INVALID_MODEL"
    assert error.message == "model_url is not a valid ONNX model"
    assert "onnxruntime: bad graph" in error.logs_tail
    assert error.invoke_id in str(error) and "bad graph" in str(error)
    assert error.invoke.status is InvokeStatus.FAILED


async def test_wait_timeout_names_the_invoke_which_keeps_going(
    sdk: AsyncClient, sim_agent: AgentFactory
) -> None:
    await sim_agent()  # online but not leasing: the invoke stays queued
    queued = await sdk.invoke("onnx_cpu", (await sdk.upload_artifact(MODEL, "model")).url)
    with pytest.raises(WaitTimeout) as caught:
        await sdk.wait(queued.id, timeout=0.1)
    assert caught.value.invoke_id == queued.id and queued.id in str(caught.value)
    assert "queued" in str(caught.value)
    assert (await sdk.get_invoke(queued.id)).status is InvokeStatus.QUEUED


async def test_cancel_then_wait_raises_invoke_canceled(
    sdk: AsyncClient, sim_agent: AgentFactory
) -> None:
    await sim_agent()
    queued = await sdk.invoke("onnx_cpu", (await sdk.upload_artifact(MODEL, "model")).url)
    canceled = await sdk.cancel(queued.id)
    assert canceled.status is InvokeStatus.CANCELED
    assert (await sdk.cancel(queued.id)).status is InvokeStatus.CANCELED  # repeatable
    with pytest.raises(InvokeCanceled) as caught:
        await sdk.wait(queued.id)
    assert caught.value.code == "CANCELED"


async def test_logs_and_follow_logs_read_everything_until_the_end(
    sdk: AsyncClient, serving: Callable[..., Awaitable[SimulatedAgent]]
) -> None:
    async def chatty(job: wire.LeasedJob) -> wire.ResultReport:
        for n in range(3):
            await agent.client.append_logs(job.invoke_id, job.lease_token, f"step {n}\n")
        return done_report(job)

    agent = await serving(chatty)
    queued = await sdk.invoke("onnx_cpu", (await sdk.upload_artifact(MODEL, "model")).url)
    followed = [piece async for piece in sdk.follow_logs(queued.id, poll_interval=0.02)]
    assert "step 0\nstep 1\nstep 2\n" in "".join(followed)
    assert "step 2" in await sdk.logs(queued.id)


async def test_the_idempotency_key_makes_invoke_safe_to_repeat(
    sdk: AsyncClient, sim_agent: AgentFactory
) -> None:
    await sim_agent()
    url = (await sdk.upload_artifact(MODEL, "model")).url
    first = await sdk.invoke("onnx_cpu", url, idempotency_key="order-42")
    again = await sdk.invoke("onnx_cpu", url, idempotency_key="order-42")
    assert again.id == first.id
    assert (await sdk.invoke("onnx_cpu", url)).id != first.id  # a fresh key per call


# Every error the coordinator answers, as its typed exception


async def test_a_wrong_key_is_unauthorized(app: FastAPI) -> None:
    transport = httpx.ASGITransport(app=app)
    async with AsyncClient("http://testserver", "gpu_sk_wrong", transport=transport) as c:
        with pytest.raises(Unauthorized) as caught:
            await c.nodes()
    assert (caught.value.status, caught.value.code) == (401, "UNAUTHORIZED")


async def test_no_key_at_all_says_how_to_give_one(
    app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPU_SHARE_API_KEY", raising=False)
    async with AsyncClient("http://testserver", transport=httpx.ASGITransport(app=app)) as c:
        with pytest.raises(Unauthorized, match="GPU_SHARE_API_KEY"):
            await c.runtimes()


async def test_a_provider_key_is_forbidden(app: FastAPI, provider: ProviderHandle) -> None:
    transport = httpx.ASGITransport(app=app)
    async with AsyncClient("http://testserver", provider.key, transport=transport) as c:
        with pytest.raises(Forbidden):
            await c.upload_artifact(MODEL, "model")


async def test_an_unknown_invoke_is_not_found(sdk: AsyncClient) -> None:
    with pytest.raises(NotFound, match=UNKNOWN_INVOKE):
        await sdk.get_invoke(UNKNOWN_INVOKE)


async def test_a_reused_idempotency_key_with_another_body_conflicts(
    sdk: AsyncClient, sim_agent: AgentFactory
) -> None:
    await sim_agent()
    url = (await sdk.upload_artifact(MODEL, "model")).url
    await sdk.invoke("onnx_cpu", url, idempotency_key="k1")
    with pytest.raises(Conflict, match="Idempotency-Key"):
        await sdk.invoke("onnx_cpu", url, idempotency_key="k1", timeout_sec=5)


async def test_an_expired_artifact_is_gone(
    sdk: AsyncClient, sim_agent: AgentFactory, clock: FrozenClock
) -> None:
    await sim_agent()
    artifact = await sdk.upload_artifact(MODEL, "model")
    clock.advance(25 * 3600)
    with pytest.raises(ArtifactExpired) as caught:
        await sdk.invoke("onnx_cpu", artifact.url)
    assert caught.value.status == 410 and "upload it again" in caught.value.message


async def test_size_limit_and_quota_are_their_own_errors(
    sdk: AsyncClient, settings: Settings
) -> None:
    settings.max_config_bytes = 10
    with pytest.raises(PayloadTooLarge) as too_large:
        await sdk.upload_artifact(b"{" + b" " * 100 + b"}", "config")
    assert too_large.value.status == 413
    settings.tenant_quota_bytes = 50
    with pytest.raises(QuotaExceeded):
        await sdk.upload_artifact(b"x" * 100, "inputs")


async def test_validation_errors_locally_and_from_the_server(
    sdk: AsyncClient, sim_agent: AgentFactory
) -> None:
    await sim_agent()
    url = (await sdk.upload_artifact(MODEL, "model")).url
    with pytest.raises(ValidationError) as local:
        await sdk.invoke("onnx_cpu", url, timeout_sec=0)
    assert local.value.status is None and "timeout_sec" in local.value.message
    with pytest.raises(ValidationError) as served:
        await sdk.invoke("onnx_cpu", url, timeout_sec=10**7)  # over the server's maximum
    assert served.value.status == 422 and "timeout_sec" in served.value.message
    with pytest.raises(ValidationError, match="kind"):
        await sdk.upload_artifact(MODEL, "outputs")


async def test_a_wrong_checksum_is_a_checksum_mismatch(
    sdk: AsyncClient, sim_agent: AgentFactory
) -> None:
    await sim_agent()
    url = (await sdk.upload_artifact(MODEL, "model")).url
    with pytest.raises(ChecksumMismatch) as caught:
        await sdk.invoke("onnx_cpu", url, model_checksum_sha256="0" * 64)
    assert caught.value.details["actual"] == hashlib.sha256(MODEL).hexdigest()


async def test_no_capacity_is_raised_at_once_with_the_servers_retry_after(
    sdk: AsyncClient,
) -> None:
    url = (await sdk.upload_artifact(MODEL, "model")).url
    with pytest.raises(NoCapacity) as caught:
        await sdk.invoke("onnx_cuda", url)
    assert caught.value.status == 503 and caught.value.retry_after == 30
    assert caught.value.message.startswith("No machine is online right now to run onnx_cuda")


# Configuration


def test_configuration_comes_from_arguments_then_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GPU_SHARE_BASE_URL", raising=False)
    with pytest.raises(ConfigurationError, match="GPU_SHARE_BASE_URL"):
        Client()
    with pytest.raises(ConfigurationError, match="http"):
        Client("gpu-share.example")
    monkeypatch.setenv("GPU_SHARE_BASE_URL", "https://gpu.example/")
    monkeypatch.setenv("GPU_SHARE_API_KEY", "gpu_sk_env")
    with Client() as client:
        assert client.base_url == "https://gpu.example"
        assert client.config.api_key == "gpu_sk_env"
        assert "gpu_sk_env" not in repr(client)
    with Client("http://other:8080", "gpu_sk_arg") as client:
        assert (client.base_url, client.config.api_key) == ("http://other:8080", "gpu_sk_arg")


# The blocking client, against the coordinator on a real port


async def test_blocking_client_over_a_real_socket(
    app: FastAPI, tenant: TenantHandle, serving: Callable[..., Awaitable[SimulatedAgent]]
) -> None:
    await serving()
    async with serve(app, lifespan=False) as base_url:

        def use() -> tuple[str, bytes | None, str]:
            with Client(base_url, tenant.key, poll_interval=POLL, retry=RETRY) as client:
                health = client.health()
                out = client.invoke_and_wait("onnx_cpu", MODEL, npz_bytes(x=np.zeros(4)))
                try:
                    client.get_invoke(UNKNOWN_INVOKE)
                except NotFound as exc:
                    return health.status, out.raw, exc.code
                raise AssertionError("no NotFound")

        status, raw, code = await asyncio.to_thread(use)
    assert (status, raw, code) == ("ok", b"", "NOT_FOUND")


async def test_progress_lines_for_uploads_and_waits_when_asked(
    app: FastAPI,
    tenant: TenantHandle,
    serving: Callable[..., Awaitable[SimulatedAgent]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    await serving()
    transport = httpx.ASGITransport(app=app)
    async with AsyncClient(
        "http://testserver", tenant.key, transport=transport, poll_interval=POLL, progress=True
    ) as client:
        out = await client.invoke_and_wait("onnx_cpu", padded_model(3 << 20))
    err = capsys.readouterr().err
    assert "\ruploading 3145728 bytes: 3.0/3.0 MiB (100%)" in err
    assert f"\r{out.invoke.id}: done (" in err
