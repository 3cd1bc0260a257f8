"""SPEC §1.3–§1.4: hosted artifacts, on both databases and both stores (a local directory
and a real S3 endpoint)."""

import asyncio
import hashlib
import io
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import numpy as np
import pytest
from fastapi import FastAPI

from gpu_share.coordinator.core.settings import ChecksumMode, Settings
from gpu_share.coordinator.loops import artifact_sweep
from gpu_share.coordinator.storage import open_store
from gpu_share.coordinator.storage.s3 import PART_BYTES
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import TenantHandle
from gpu_share.testing.models import identity_model
from gpu_share.testing.s3 import S3Endpoint
from gpu_share.testing.servers import serve


def inputs(length: int, fill: int = 0) -> bytes:
    """A real inputs NPZ (an upload is checked for what its kind promises), about
    `length` + 250 bytes."""
    buffer = io.BytesIO()
    np.savez(buffer, x=np.full(length, fill, dtype=np.uint8))
    return buffer.getvalue()


PAYLOAD = inputs(10240, 7)
MODEL = identity_model()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(params=["local", "s3"])
def settings(request: pytest.FixtureRequest, settings: Settings) -> Settings:
    if request.param == "s3":
        endpoint: S3Endpoint = request.getfixturevalue("s3_endpoint")
        endpoint.use_for(settings)
    return settings


def stored_files(settings: Settings) -> list[str]:
    """Every object in the store: the published keys, and one "temporary" entry for each
    upload left unpublished (which this removes, counting them)."""
    store = open_store(settings)
    return sorted(store.keys()) + ["temporary"] * store.sweep_temporary(0)


def uploads_in_flight(settings: Settings, endpoint: S3Endpoint | None) -> bool:
    if endpoint is None:
        return any((settings.artifacts_path / "tmp").iterdir())
    return bool(endpoint.multipart_uploads(settings.s3_bucket))


async def upload(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    data: bytes = PAYLOAD,
    kind: str = "inputs",
    **params: str,
) -> httpx.Response:
    return await client.post(
        "/v1/artifacts",
        params={"kind": kind, **params},
        content=data,
        headers={**tenant.headers, "Content-Type": "application/octet-stream"},
    )


async def test_seed_upload_returns_url_and_download_gives_exact_bytes(
    client: httpx.AsyncClient, tenant: TenantHandle, clock: FrozenClock
) -> None:
    response = await upload(client, tenant, content_sha256=sha(PAYLOAD))
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["id"].startswith("art_")
    assert body["url"] == f"http://testserver/v1/artifacts/{body['id']}/download"
    assert (body["kind"], body["size"], body["sha256"]) == ("inputs", len(PAYLOAD), sha(PAYLOAD))
    assert body["expires_at"].startswith(
        (clock.now() + timedelta(hours=24)).strftime("%Y-%m-%dT%H:%M")
    )

    download = await client.get(body["url"], headers=tenant.headers)
    assert download.status_code == 200
    assert download.content == PAYLOAD
    assert download.headers["x-content-sha256"] == sha(PAYLOAD)


async def test_upload_accepts_uppercase_checksum_and_any_content_type(
    client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    response = await client.post(
        "/v1/artifacts",
        params={"kind": "model", "content_sha256": sha(MODEL).upper()},
        content=MODEL,
        headers={**tenant.headers, "Content-Type": "application/x-www-form-urlencoded"},
    )
    assert response.status_code == 201


@pytest.mark.parametrize("kind", ["weights", "outputs", ""])
async def test_unknown_kind_is_422(
    client: httpx.AsyncClient, tenant: TenantHandle, kind: str
) -> None:
    response = await upload(client, tenant, kind=kind)
    assert response.status_code == 422
    assert "kind" in response.json()["error"]["message"]


@pytest.mark.parametrize("bad", ["abc", "g" * 64, "a" * 63, "a" * 65])
async def test_checksum_not_64_hex_chars_is_422(
    client: httpx.AsyncClient, tenant: TenantHandle, bad: str
) -> None:
    response = await upload(client, tenant, content_sha256=bad)
    assert response.status_code == 422
    assert "content_sha256" in response.json()["error"]["message"]


async def test_checksum_mismatch_is_422_and_stores_nothing(
    client: httpx.AsyncClient, tenant: TenantHandle, settings: Settings
) -> None:
    response = await upload(client, tenant, content_sha256=sha(b"something else"))
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "CHECKSUM_MISMATCH"
    assert error["details"]["actual"] == sha(PAYLOAD)
    assert stored_files(settings) == []
    assert (await client.get("/v1/artifacts", headers=tenant.headers)).json()["items"] == []


async def test_enforce_mode_requires_content_sha256(
    client: httpx.AsyncClient, tenant: TenantHandle, settings: Settings
) -> None:
    settings.checksum_mode = ChecksumMode.ENFORCE
    response = await upload(client, tenant)
    assert response.status_code == 422
    assert "CHECKSUM_MODE=enforce" in response.json()["error"]["message"]
    assert (await upload(client, tenant, content_sha256=sha(PAYLOAD))).status_code == 201


async def test_body_over_the_kinds_limit_is_413_and_stores_nothing(
    client: httpx.AsyncClient, tenant: TenantHandle, settings: Settings
) -> None:
    settings.max_model_bytes = len(MODEL)

    async def chunked() -> AsyncIterator[
        bytes
    ]:  # no Content-Length: the limit is found while streaming
        for _ in range(10):
            yield MODEL

    response = await client.post(
        "/v1/artifacts", params={"kind": "model"}, content=chunked(), headers=tenant.headers
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"
    assert stored_files(settings) == []
    assert (await upload(client, tenant, MODEL, kind="model")).status_code == 201


async def test_declared_oversize_body_is_refused_before_it_is_sent(
    app: FastAPI, tenant: TenantHandle, settings: Settings
) -> None:
    settings.max_inputs_bytes = 1 << 20
    async with serve(app, lifespan=False) as base_url:
        port = int(base_url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            (
                "POST /v1/artifacts?kind=inputs HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer {tenant.key}\r\n"
                f"Content-Length: {(1 << 20) + 1}\r\n\r\n"
            ).encode()
        )
        await writer.drain()
        # No body is ever sent: an answer can only come if the server did not wait for it.
        status_line = await asyncio.wait_for(reader.readline(), timeout=5)
        writer.close()
    assert b" 413 " in status_line
    assert stored_files(settings) == []


async def test_quota_exceeded_is_413_quota_exceeded(
    client: httpx.AsyncClient, tenant: TenantHandle, settings: Settings
) -> None:
    first, second, third = inputs(1750, 1), inputs(1250, 2), inputs(750, 3)
    quota = settings.tenant_quota_bytes = len(first) + len(second) - 1
    assert (await upload(client, tenant, first)).status_code == 201
    response = await upload(client, tenant, second)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "QUOTA_EXCEEDED"
    assert response.json()["error"]["details"] == {"quota_bytes": quota, "used_bytes": len(first)}
    assert (await upload(client, tenant, third)).status_code == 201


async def test_concurrent_uploads_cannot_exceed_the_quota_together(
    client: httpx.AsyncClient, tenant: TenantHandle, settings: Settings
) -> None:
    bodies = [inputs(2000, i) for i in range(4)]
    settings.tenant_quota_bytes = len(bodies[0]) * 5 // 2
    responses = await asyncio.gather(*(upload(client, tenant, body) for body in bodies))
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [201, 201, 413, 413]
    listed = (await client.get("/v1/artifacts", headers=tenant.headers)).json()["items"]
    assert sum(a["size"] for a in listed) == 2 * len(bodies[0])
    assert len(stored_files(settings)) == 2


async def test_client_disconnecting_mid_upload_stores_nothing(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    settings: Settings,
    request: pytest.FixtureRequest,
) -> None:
    endpoint = request.getfixturevalue("s3_endpoint") if settings.storage == "s3" else None
    async with serve(app, lifespan=False) as base_url:
        port = int(base_url.rsplit(":", 1)[1])
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            (
                "POST /v1/artifacts?kind=inputs HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer {tenant.key}\r\nContent-Length: {16 << 20}\r\n\r\n"
            ).encode()
        )
        writer.write(b"z" * (PART_BYTES + (2 << 20)))  # past S3's first part
        await writer.drain()
        for _ in range(500):  # until the server is writing the upload
            if await asyncio.to_thread(uploads_in_flight, settings, endpoint):
                break
            await asyncio.sleep(0.01)
        assert await asyncio.to_thread(uploads_in_flight, settings, endpoint), "never started"
        writer.transport.abort()
        for _ in range(500):
            if not await asyncio.to_thread(uploads_in_flight, settings, endpoint):
                break
            await asyncio.sleep(0.01)
        assert not await asyncio.to_thread(uploads_in_flight, settings, endpoint)
    assert stored_files(settings) == []
    assert (await client.get("/v1/artifacts", headers=tenant.headers)).json()["items"] == []
    settings.tenant_quota_bytes = len(PAYLOAD)
    assert (await upload(client, tenant)).status_code == 201  # the quota is untouched


async def test_other_tenants_artifact_is_404_everywhere(
    client: httpx.AsyncClient, tenant: TenantHandle, other_tenant: TenantHandle
) -> None:
    artifact = (await upload(client, tenant)).json()
    for method, path in [
        ("GET", f"/v1/artifacts/{artifact['id']}"),
        ("GET", f"/v1/artifacts/{artifact['id']}/download"),
        ("DELETE", f"/v1/artifacts/{artifact['id']}"),
    ]:
        response = await client.request(method, path, headers=other_tenant.headers)
        assert response.status_code == 404, (method, path)
        assert response.json()["error"]["code"] == "NOT_FOUND"
    assert (await client.get(artifact["url"], headers=tenant.headers)).content == PAYLOAD


async def test_same_bytes_are_stored_once_and_survive_one_owner_deleting(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    settings: Settings,
) -> None:
    mine = (await upload(client, tenant)).json()
    theirs = (await upload(client, other_tenant)).json()
    assert mine["id"] != theirs["id"]
    assert len(stored_files(settings)) == 1

    assert (
        await client.delete(f"/v1/artifacts/{mine['id']}", headers=tenant.headers)
    ).status_code == 204
    assert (await client.get(mine["url"], headers=tenant.headers)).status_code == 404
    assert (await client.get(theirs["url"], headers=other_tenant.headers)).content == PAYLOAD
    assert len(stored_files(settings)) == 1

    await client.delete(f"/v1/artifacts/{theirs['id']}", headers=other_tenant.headers)
    assert stored_files(settings) == []


async def test_expired_artifact_is_410_and_the_sweep_deletes_its_bytes(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    settings: Settings,
    clock: FrozenClock,
) -> None:
    artifact = (await upload(client, tenant)).json()
    clock.advance(settings.artifact_ttl_sec + 1)
    response = await client.get(artifact["url"], headers=tenant.headers)
    assert response.status_code == 410
    assert response.json()["error"]["code"] == "ARTIFACT_EXPIRED"
    assert "upload it again" in response.json()["error"]["message"]
    assert len(stored_files(settings)) == 1

    report = await artifact_sweep.run_once(app.state.replica)
    assert (report.expired, report.blobs_deleted) == (1, 1)
    assert stored_files(settings) == []
    assert (await client.get(artifact["url"], headers=tenant.headers)).status_code == 410
    live = await client.get("/v1/artifacts", headers=tenant.headers)
    assert live.json()["items"] == []
    everything = await client.get(
        "/v1/artifacts", params={"include_expired": "true"}, headers=tenant.headers
    )
    assert [a["id"] for a in everything.json()["items"]] == [artifact["id"]]


async def test_expired_artifacts_no_longer_count_against_the_quota(
    client: httpx.AsyncClient, tenant: TenantHandle, settings: Settings, clock: FrozenClock
) -> None:
    settings.tenant_quota_bytes = 2 * len(PAYLOAD)
    await upload(client, tenant)
    await upload(client, tenant, inputs(10240, 8))  # as large, other bytes
    more = inputs(4)
    assert (await upload(client, tenant, more)).status_code == 413
    clock.advance(settings.artifact_ttl_sec + 1)
    assert (await upload(client, tenant, more)).status_code == 201


async def test_sweep_keeps_bytes_another_live_artifact_shares(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    settings: Settings,
    clock: FrozenClock,
) -> None:
    old = (await upload(client, tenant)).json()
    clock.advance(settings.artifact_ttl_sec - 10)
    fresh = (await upload(client, other_tenant)).json()
    clock.advance(20)
    await artifact_sweep.run_once(app.state.replica)
    assert (await client.get(old["url"], headers=tenant.headers)).status_code == 410
    assert (await client.get(fresh["url"], headers=other_tenant.headers)).content == PAYLOAD


async def test_listing_pages_and_filters_by_hash(
    client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    ids = [(await upload(client, tenant, inputs(10, i))).json()["id"] for i in range(5)]
    first = (await client.get("/v1/artifacts", params={"limit": 2}, headers=tenant.headers)).json()
    assert [a["id"] for a in first["items"]] == ids[::-1][:2]
    second = (
        await client.get(
            "/v1/artifacts",
            params={"limit": 2, "cursor": first["next_cursor"]},
            headers=tenant.headers,
        )
    ).json()
    assert [a["id"] for a in second["items"]] == ids[::-1][2:4]
    by_hash = (
        await client.get(
            "/v1/artifacts", params={"sha256": sha(inputs(10, 3))}, headers=tenant.headers
        )
    ).json()
    assert [a["id"] for a in by_hash["items"]] == [ids[3]]


@pytest.mark.parametrize("kind", ["model", "inputs", "config"])
async def test_an_empty_body_is_no_artifact_of_any_kind(
    client: httpx.AsyncClient, tenant: TenantHandle, settings: Settings, kind: str
) -> None:
    response = await upload(client, tenant, b"", kind=kind, content_sha256=sha(b""))
    assert response.status_code == 422
    assert "it is empty" in response.json()["error"]["message"]
    assert stored_files(settings) == []
