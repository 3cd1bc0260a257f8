"""Job outputs and checkpoints stored on the platform count against the tenant's quota
like uploads do; the tenant makes room by deleting old artifacts."""

import hashlib
import io
from pathlib import Path

import httpx
import numpy as np
import pytest

from gpu_share.agent.client import CoordinatorError
from gpu_share.coordinator.core.settings import Settings
from gpu_share.testing.factories import HELLO_WORLD, TenantHandle
from gpu_share.testing.simulated_agent import AgentFactory

QUOTA = 10_000


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"tenant_quota_bytes": QUOTA})


def blob(tmp_path: Path, size: int) -> tuple[Path, str]:
    path = tmp_path / f"blob-{size}"
    path.write_bytes(b"o" * size)
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


async def test_outputs_over_the_quota_are_refused_until_the_tenant_deletes_some(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory, tmp_path: Path
) -> None:
    inputs = io.BytesIO()
    np.savez(inputs, x=np.zeros(7_700, dtype=np.uint8))  # 8 KB of the 10 KB quota
    old = await client.post(
        "/v1/artifacts",
        params={"kind": "inputs"},
        content=inputs.getvalue(),
        headers=tenant.headers,
    )
    assert old.status_code == 201
    agent = await sim_agent()
    await client.post(
        "/v1/gpu/invoke", json={**HELLO_WORLD, "runtime": "onnx_cpu"}, headers=tenant.headers
    )
    (job,) = await agent.lease()
    path, sha = blob(tmp_path, 4_000)
    with pytest.raises(CoordinatorError) as refused:
        await agent.client.store_outputs(job.invoke_id, job.lease_token, path, sha)
    assert (refused.value.status, refused.value.code) == (413, "QUOTA_EXCEEDED")
    with pytest.raises(CoordinatorError) as checkpoint:  # and an ONNX job keeps none at all
        await agent.client.store_checkpoint(job.invoke_id, job.lease_token, path, sha)
    assert checkpoint.value.code == "VALIDATION_ERROR"

    deleted = await client.delete(f"/v1/artifacts/{old.json()['id']}", headers=tenant.headers)
    assert deleted.status_code == 204
    stored = await agent.client.store_outputs(job.invoke_id, job.lease_token, path, sha)
    listed = await client.get("/v1/artifacts", params={"kind": "outputs"}, headers=tenant.headers)
    assert [a["id"] for a in listed.json()["items"]] == [stored.artifact_id]
