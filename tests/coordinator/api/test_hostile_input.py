"""Hostile input gets its documented 4xx before any work is done, on both databases:
oversized bodies and headers, NUL characters, malformed ids, numbers without bounds."""

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from gpu_share.coordinator.api.limits import DRAIN_AT_MOST
from gpu_share.coordinator.core.ids import new_id
from gpu_share.testing.factories import HELLO_WORLD, TenantHandle
from gpu_share.testing.simulated_agent import AgentFactory, inventory

MiB = 1024 * 1024
NO_KEY: dict[str, str] = {}


class Body:
    """A request body that counts how much of it the server read."""

    def __init__(self, total: int, chunk: int = 64 * 1024) -> None:
        self.total, self.chunk, self.sent = total, chunk, 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while self.sent < self.total:
            piece = b"[" + b" " * (self.chunk - 1)
            self.sent += len(piece)
            yield piece


@pytest.mark.parametrize(
    "path", ["/v1/gpu/invoke", "/v1/agent/heartbeat", "/v1/tenant/applications"]
)
async def test_a_huge_body_without_a_key_is_413_before_it_is_read(
    client: httpx.AsyncClient, path: str
) -> None:
    body = Body(300 * MiB)
    declared = await client.post(
        path, content=body, headers={"Content-Length": str(300 * MiB), **NO_KEY}
    )
    assert declared.status_code == 413, declared.text
    assert declared.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"
    assert body.sent <= 64 * 1024  # refused on its declared length, not read

    streamed = Body(300 * MiB)
    chunked = await client.post(path, content=streamed)  # no Content-Length: counted
    assert chunked.status_code == 413
    # refused once past the limit: at most a bounded excess is read (and dropped) so the
    # client hears the 413; the 300 MB never arrive
    assert streamed.sent <= DRAIN_AT_MOST + 64 * 1024


async def test_huge_headers_are_431(client: httpx.AsyncClient) -> None:
    response = await client.get("/health", headers={"X-Padding": "x" * MiB})
    assert response.status_code == 431
    assert response.json()["error"]["code"] == "HEADERS_TOO_LARGE"


@pytest.mark.parametrize(
    "path",
    [
        "/v1/gpu/invokes/inv_nope",
        "/v1/gpu/invokes/inv_%00",
        "/v1/gpu/sessions/ses_..",
        "/v1/artifacts/art_" + "z" * 300,
        "/v1/gpu/invokes/ses_01m90ybp4k7k1fjr7c0292k00j",  # an id of another kind
    ],
)
async def test_a_malformed_id_in_a_path_is_422(
    client: httpx.AsyncClient, tenant: TenantHandle, path: str
) -> None:
    response = await client.get(path, headers=tenant.headers)
    assert response.status_code == 422, response.text


async def test_a_well_formed_unknown_id_is_still_404(
    client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    response = await client.get(f"/v1/gpu/invokes/{new_id('inv')}", headers=tenant.headers)
    assert response.status_code == 404


@pytest.mark.parametrize(
    ("method", "path", "params", "body"),
    [
        ("get", "/v1/gpu/invokes", {"cursor": "inv_\x00"}, None),
        ("get", "/v1/artifacts", {"kind": "model\x00"}, None),
        ("post", "/v1/gpu/invoke", None, {**HELLO_WORLD, "gpu_model": "H100\x00"}),
        ("post", "/v1/gpu/invoke", None, {**HELLO_WORLD, "region": "\x00"}),
    ],
)
async def test_nul_characters_are_422_on_every_database(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    method: str,
    path: str,
    params: dict[str, str] | None,
    body: dict[str, Any] | None,
) -> None:
    response = await client.request(method, path, params=params, json=body, headers=tenant.headers)
    assert response.status_code == 422, response.text
    assert "NUL" in response.json()["error"]["message"]


@pytest.mark.parametrize("price", ["1e308", '"Infinity"', '"NaN"', "-1", "1e400", '"1e-9"'])
@pytest.mark.parametrize("path", ["/v1/gpu/sessions", "/v1/gpu/invoke"])
async def test_unbounded_prices_are_422(
    client: httpx.AsyncClient, tenant: TenantHandle, price: str, path: str
) -> None:
    body = (
        '{"runtime": "onnx_cpu", "model_url": "https://example.com/m.onnx", '
        f'"max_price_per_gpu_hour": {price}}}'
    )
    response = await client.post(
        path, content=body, headers={**tenant.headers, "Content-Type": "application/json"}
    )
    assert response.status_code == 422, response.text
    assert response.json()["error"]["details"][0]["loc"][-1] == "max_price_per_gpu_hour"


async def test_a_log_cursor_past_any_storable_id_is_422(
    client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    response = await client.get(
        f"/v1/gpu/invokes/{new_id('inv')}/logs", params={"after": 2**63}, headers=tenant.headers
    )
    assert response.status_code == 422


@pytest.mark.parametrize(
    "change",
    [
        {"ram_mb": 10**30},
        {"cpu_count": 10**9},
        {"gpus": [{"index": 0, "uuid": "GPU-1", "model": "H100", "vram_mb": 10**30}]},
        {"hostname": "node\x00"},
    ],
)
async def test_an_inventory_with_impossible_values_is_422(
    client: httpx.AsyncClient, sim_agent: AgentFactory, change: dict[str, Any]
) -> None:
    agent = await sim_agent()
    body = {**inventory().model_dump(mode="json"), **change}
    response = await client.put(
        "/v1/agent/inventory", json=body, headers={"Authorization": f"Bearer {agent.client.key}"}
    )
    assert response.status_code == 422, response.text


@pytest.mark.parametrize(
    "telemetry",
    [
        '{"cpu_pct": NaN}',
        '{"gpus": [{"index": 0, "temperature_c": Infinity}]}',
        '{"ram_used_mb": 1e30}',
        '{"gpus": [{"index": 99999999999999999999}]}',
    ],
)
async def test_a_heartbeat_with_non_finite_telemetry_is_422(
    client: httpx.AsyncClient, sim_agent: AgentFactory, telemetry: str
) -> None:
    agent = await sim_agent()
    response = await client.post(
        "/v1/agent/heartbeat",
        content=f'{{"telemetry": {telemetry}, "running": []}}',
        headers={"Authorization": f"Bearer {agent.client.key}", "Content-Type": "application/json"},
    )
    assert response.status_code == 422, response.text
