"""SPEC §1.8 error shape for framework errors; §1.2 health; OpenAPI and docs."""

import re
from typing import Any

import httpx
import pytest
import yaml
from fastapi import FastAPI

from gpu_share.coordinator.core.db import Database
from gpu_share.testing.factories import TenantHandle
from gpu_share.testing.models import identity_model


async def test_unknown_route_is_404_in_the_error_shape(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/nothing-here")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "NOT_FOUND"


async def test_wrong_method_is_405_in_the_error_shape(client: httpx.AsyncClient) -> None:
    response = await client.put("/health")
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "METHOD_NOT_ALLOWED"


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[]",
        b'{"name": 5}',
        b"\xff\xfe",
        b"\xff\xfe\x00",
        b'{"name":"a","email":"a@b.cd"',
    ],
    ids=repr,
)
async def test_malformed_json_is_422_with_details(client: httpx.AsyncClient, body: bytes) -> None:
    response = await client.post(
        "/v1/tenant/applications", content=body, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "VALIDATION_ERROR"
    assert isinstance(error["details"], list) and error["details"]


async def test_health_reports_database_and_version(client: httpx.AsyncClient) -> None:
    response = await client.get("/health")
    assert response.status_code == 200
    assert response.json() == {
        "status": "ok",
        "version": "0.4.0",
        "database": "ok",
        "nodes_online": 0,
    }


async def test_health_is_503_degraded_when_the_database_is_unreachable(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    replica = app.state.replica
    healthy_db = replica.db
    replica.db = Database("postgresql+asyncpg://nobody@127.0.0.1:9/none")
    try:
        response = await client.get("/health")
    finally:
        await replica.db.dispose()
        replica.db = healthy_db
    assert response.status_code == 503
    assert response.json()["status"] == "degraded"
    assert response.json()["database"] == "unreachable"


async def test_openapi_json_and_yaml_agree_and_carry_version(client: httpx.AsyncClient) -> None:
    as_json = (await client.get("/openapi.json")).json()
    as_yaml = yaml.safe_load((await client.get("/openapi.yaml")).text)
    assert as_json == as_yaml
    assert as_json["info"]["version"] == "0.4.0"


# Anyone may call these: applying, confirming the email, following an application, claiming
# an account.
PUBLIC = {
    "/v1/tenant/applications",
    "/v1/tenant/applications/confirm/{token}",
    "/v1/provider/gpu-models",
    "/v1/provider/applications",
    "/v1/provider/applications/confirm/{token}",
    "/v1/provider/applications/status/{token}",
    "/v1/provider/claim/{token}",
}


async def test_every_keyed_operation_documents_its_errors(client: httpx.AsyncClient) -> None:
    spec: dict[str, Any] = (await client.get("/openapi.json")).json()
    for path, operations in spec["paths"].items():
        for method, op in operations.items():
            responses = op["responses"]
            if path.startswith("/v1/") and path not in PUBLIC:
                assert "401" in responses, f"{method} {path}"
                if path != "/v1/agent/register":  # an enrollment token has no role
                    assert "403" in responses, f"{method} {path}"
            for status, response in responses.items():
                if status.startswith(("4", "5")) and path != "/health":
                    schema = response["content"]["application/json"]["schema"]
                    assert schema["$ref"].endswith("/ErrorResponse"), f"{method} {path} {status}"


async def test_swagger_ui_is_served_with_its_own_assets_and_no_cdn(
    client: httpx.AsyncClient,
) -> None:
    response = await client.get("/docs")
    assert response.status_code == 200
    assert "swagger-ui" in response.text
    assert "/openapi.json" in response.text
    assets = re.findall(r'(?:src|href)="([^"]+)"', response.text)
    assert assets and all(url.startswith("/static/") for url in assets), assets
    assert "cdn" not in response.text and "https://" not in response.text
    for url in assets:
        asset = await client.get(url)
        assert asset.status_code == 200 and len(asset.content) > 200, url  # not empty


async def test_openapi_declares_the_bearer_scheme_on_every_keyed_operation(
    client: httpx.AsyncClient,
) -> None:
    spec = (await client.get("/openapi.json")).json()
    scheme = spec["components"]["securitySchemes"]["bearerAuth"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    keyed: list[tuple[str, str]] = []
    open_: list[tuple[str, str]] = []
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            (keyed if "401" in operation["responses"] else open_).append((method, path))
            if "401" in operation["responses"] and path != "/v1/agent/register":
                assert operation.get("security") == [{"bearerAuth": []}], (method, path)
    assert ("post", "/v1/gpu/invoke") in keyed and ("get", "/health") in open_
    assert {path for _, path in open_ if path.startswith("/v1/")} == PUBLIC
    assert "security" not in spec["paths"]["/health"]["get"]


async def test_upload_operation_documents_a_binary_body(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    upload = spec["paths"]["/v1/artifacts"]["post"]
    assert "application/octet-stream" in upload["requestBody"]["content"]
    assert {"201", "401", "413", "422"} <= set(upload["responses"])


async def test_another_tenants_listing_is_empty(
    client: httpx.AsyncClient, tenant: TenantHandle, other_tenant: TenantHandle
) -> None:
    mine = await client.post(
        "/v1/artifacts?kind=model", content=identity_model(), headers=tenant.headers
    )
    assert mine.status_code == 201
    listed = await client.get("/v1/artifacts", headers=other_tenant.headers)
    assert listed.json() == {"items": [], "next_cursor": None}


async def test_the_api_documents_starts_where_tenants_start_and_names_every_tag(
    client: httpx.AsyncClient,
) -> None:
    spec = (await client.get("/openapi.json")).json()
    listed = [tag["name"] for tag in spec["tags"]]
    assert listed[0] == "invokes" and listed[-1] == "agent"
    used = {
        tag
        for operations in spec["paths"].values()
        for operation in operations.values()
        for tag in operation.get("tags", [])
    }
    assert used <= set(listed), f"tags missing from api/docs.TAGS: {used - set(listed)}"
    assert all(tag["description"] for tag in spec["tags"])
