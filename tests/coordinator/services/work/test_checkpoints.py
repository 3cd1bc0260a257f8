"""Checkpoints (SPEC §4.3): a requeued training job is leased with its newest snapshot,
and only a snapshot its runtime wrote is ever kept (a preempted attempt is charged up to
it: docs/billing.md)."""

import hashlib
import json
import struct
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from gpu_share.agent.client import CoordinatorError, StaleLease
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.loops import lease_expiry
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import TenantHandle
from gpu_share.testing.simulated_agent import AgentFactory, inventory


def catboost_snapshot(progress: bytes = b"\x01" * 64, *, task_type: str = "CPU") -> bytes:
    """A snapshot as CatBoost writes its head (`TProgressHelper`): the label, the options
    as length-prefixed JSON, then the progress (here, filler)."""
    label = task_type.encode()
    options = json.dumps(
        {"task_type": task_type, "loss_function": {"type": "RMSE"}, "boosting_options": {}}
    ).encode()
    return struct.pack("<I", 3) + label + struct.pack("<I", len(options)) + options + progress


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
    versions = [catboost_snapshot(b"snapshot-1" * 4), catboost_snapshot(b"snapshot-2" * 4)]
    for version in versions:
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
    assert retry.checkpoint.sha256 == hashlib.sha256(versions[1]).hexdigest()
    downloaded = tmp_path / "restored"
    sha, size = await second.client.download(
        retry.checkpoint.url, downloaded, max_bytes=1 << 20, timeout=10
    )
    assert downloaded.read_bytes() == versions[1]

    path = tmp_path / "late"
    path.write_bytes(catboost_snapshot(b"late snapshot" * 4))
    with pytest.raises(StaleLease):
        await first.client.store_checkpoint(
            invoke_id, job.lease_token, path, hashlib.sha256(path.read_bytes()).hexdigest()
        )
    kinds = await client.get("/v1/artifacts", params={"kind": "checkpoint"}, headers=tenant.headers)
    assert [a["size"] for a in kinds.json()["items"]] == [len(versions[1])]
    del sha, size


@pytest.fixture(scope="module")
def real_snapshot(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A snapshot CatBoost itself wrote, a few iterations into a small training."""
    import catboost
    import numpy as np

    folder = tmp_path_factory.mktemp("catboost")
    x = np.random.default_rng(1).random((200, 4))
    catboost.CatBoostRegressor(
        iterations=20,
        save_snapshot=True,
        snapshot_file=str(folder / "snapshot.cbs"),
        train_dir=str(folder / "train"),
        thread_count=1,
        verbose=0,
    ).fit(x, x[:, 0])
    return (folder / "snapshot.cbs").read_bytes()


@pytest.mark.parametrize(
    ("runtime", "make", "refusal"),
    [
        ("catboost_cpu", lambda real: b"\x00" * 150, "does not start with CatBoost's"),
        ("catboost_cpu", lambda real: real[:200], "it ends after"),
        ("catboost_cpu", lambda real: real.replace(b"CPU", b"XYZ", 1), "its label is b'XYZ'"),
        (
            "catboost_cpu",
            lambda real: real[:11] + b"!" * (len(real) - 11),
            "its options are not JSON",
        ),
        (
            "catboost_cpu",
            lambda real: catboost_snapshot(task_type="GPU").replace(b'"GPU"', b'"CPU"'),
            "not a CatBoost training's",
        ),
        ("onnx_cpu", lambda real: real, "onnx_cpu jobs keep no checkpoints"),
    ],
    ids=["150-junk-bytes", "truncated", "label", "options", "task-type", "onnx"],
)
async def test_a_checkpoint_its_runtime_did_not_write_is_refused_and_stored_nowhere(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    tmp_path: Path,
    real_snapshot: bytes,
    runtime: str,
    make: Callable[[bytes], bytes],
    refusal: str,
) -> None:
    agent = await sim_agent(inventory(runtimes=[RuntimeName(runtime)]))
    body = {**TRAIN, "runtime": runtime}
    assert (await client.post("/v1/gpu/invoke", json=body, headers=tenant.headers)).is_success
    (job,) = await agent.lease()
    path = tmp_path / "snapshot"
    path.write_bytes(make(real_snapshot))
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(CoordinatorError) as refused:
        await agent.client.store_checkpoint(job.invoke_id, job.lease_token, path, sha)
    assert (refused.value.status, refused.value.code) == (422, "VALIDATION_ERROR")
    assert refusal in refused.value.message
    listed = await client.get("/v1/artifacts", headers=tenant.headers)
    assert listed.json()["items"] == []
    if runtime != "onnx_cpu":  # what CatBoost wrote itself, CPU or GPU, is kept
        for good in (real_snapshot, catboost_snapshot(task_type="GPU")):
            path.write_bytes(good)
            sha = hashlib.sha256(good).hexdigest()
            stored = await agent.client.store_checkpoint(job.invoke_id, job.lease_token, path, sha)
            assert stored.size == len(good)
