"""Checkpoints (SPEC §4.3): a requeued training job is leased with its newest snapshot."""

import hashlib
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from gpu_share.agent.client import StaleLease
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.loops import lease_expiry
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import TenantHandle
from gpu_share.testing.simulated_agent import AgentFactory, inventory

TRAIN = {
    "runtime": "catboost_cpu",
    "model_url": "https://example.com/train_config.json",
    "inputs_url": "https://example.com/data.npz",
    "timeout_sec": 600,
}


async def test_newest_checkpoint_goes_to_the_next_attempt_and_old_ones_are_deleted(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
    settings: Settings,
    tmp_path: Path,
) -> None:
    node = inventory(runtimes=[RuntimeName.CATBOOST_CPU])
    first, second = await sim_agent(node), await sim_agent(node)
    invoke_id = (await client.post("/v1/gpu/invoke", json=TRAIN, headers=tenant.headers)).json()[
        "id"
    ]
    (job,) = await first.lease()
    assert job.checkpoint is None
    await first.client.start(job.invoke_id, job.lease_token)
    for version in (b"snapshot-1", b"snapshot-2"):
        path = tmp_path / "snap"
        path.write_bytes(version)
        stored = await first.client.store_checkpoint(
            invoke_id, job.lease_token, path, hashlib.sha256(version).hexdigest()
        )
        assert stored.size == len(version)
    kinds = await client.get("/v1/artifacts", params={"kind": "checkpoint"}, headers=tenant.headers)
    assert len(kinds.json()["items"]) == 1, "the older snapshot was replaced"

    clock.advance(settings.lease_ttl_sec + 1)
    await lease_expiry.run_once(app.state.replica)
    (retry,) = await second.lease()
    assert retry.attempt == 2
    assert retry.checkpoint is not None and retry.checkpoint.platform
    assert retry.checkpoint.sha256 == hashlib.sha256(b"snapshot-2").hexdigest()
    downloaded = tmp_path / "restored"
    sha, size = await second.client.download(
        retry.checkpoint.url, downloaded, max_bytes=1 << 20, timeout=10
    )
    assert downloaded.read_bytes() == b"snapshot-2"

    path = tmp_path / "late"
    path.write_bytes(b"late snapshot")
    with pytest.raises(StaleLease):
        await first.client.store_checkpoint(
            invoke_id, job.lease_token, path, hashlib.sha256(b"late snapshot").hexdigest()
        )
    kinds = await client.get("/v1/artifacts", params={"kind": "checkpoint"}, headers=tenant.headers)
    assert [a["size"] for a in kinds.json()["items"]] == [len(b"snapshot-2")]
    del sha, size
