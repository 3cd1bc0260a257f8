"""`POST /v1/gpu/probe-url` (SPEC §1.5): the agent's fetch rules, answered to the tenant."""

from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import Response

from gpu_share.coordinator.core.settings import Settings
from gpu_share.testing.factories import TenantHandle
from gpu_share.testing.models import identity_model
from gpu_share.testing.servers import serve


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",
        "http://localhost:8080/v1/admin/tenants",
        "http://10.0.0.1/model.onnx",
        "http://192.168.1.1/",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://2130706433/",
        "http://0x7f000001/",
        "http://127.1/",
        "file:///etc/passwd",
        "gopher://example.com/",
    ],
)
async def test_hostile_urls_are_unreachable_with_a_reason(
    client: httpx.AsyncClient, tenant: TenantHandle, url: str
) -> None:
    response = await client.post("/v1/gpu/probe-url", json={"url": url}, headers=tenant.headers)
    assert response.status_code == 200
    body = response.json()
    assert body["reachable"] is False
    assert body["error"]


@pytest.fixture
async def file_server() -> AsyncIterator[str]:
    site = FastAPI()

    @site.get("/model.onnx")
    async def model() -> Response:
        return Response(b"x" * 1234, media_type="application/octet-stream")

    async with serve(site) as base_url:
        yield base_url


async def test_an_allowed_server_is_reachable_with_its_size(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    settings: Settings,
    file_server: str,
    app: FastAPI,
) -> None:
    from gpu_share.netguard import SafeFetcher, UrlPolicy

    replica = app.state.replica
    await replica.fetcher.aclose()
    replica.fetcher = SafeFetcher(UrlPolicy.from_strings(["127.0.0.0/8"]))
    response = await client.post(
        "/v1/gpu/probe-url", json={"url": f"{file_server}/model.onnx"}, headers=tenant.headers
    )
    assert response.json() == {
        "reachable": True,
        "status_code": 200,
        "content_length": 1234,
        "content_type": "application/octet-stream",
        "error": None,
    }
    missing = await client.post(
        "/v1/gpu/probe-url", json={"url": f"{file_server}/nope"}, headers=tenant.headers
    )
    assert missing.json()["reachable"] is False
    assert missing.json()["status_code"] == 404


async def test_own_artifact_urls_probe_as_reachable_for_the_owner_only(
    client: httpx.AsyncClient, tenant: TenantHandle, other_tenant: TenantHandle
) -> None:
    model = identity_model()
    uploaded = await client.post(
        "/v1/artifacts", params={"kind": "model"}, content=model, headers=tenant.headers
    )
    url = uploaded.json()["url"]
    mine = (
        await client.post("/v1/gpu/probe-url", json={"url": url}, headers=tenant.headers)
    ).json()
    assert (mine["reachable"], mine["content_length"]) == (True, len(model))
    theirs = (
        await client.post("/v1/gpu/probe-url", json={"url": url}, headers=other_tenant.headers)
    ).json()
    assert theirs["reachable"] is False
    assert theirs["status_code"] == 404
