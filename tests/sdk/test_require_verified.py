"""`require_verified` from the SDK (docs/trust.md): sent on invokes, sessions and
reservations when it differs from the coordinator's default (so an older coordinator
still accepts the body), and honoured; nodes come back with their `verified` flags."""

import pytest

from gpu_share import AsyncClient
from gpu_share.protocol.sessions import SessionCreate
from gpu_share.sdk import NoCapacity, ValidationError, _api, _reservations, _sessions
from gpu_share.testing.factories import HELLO_WORLD, TenantHandle
from gpu_share.testing.rentals import Rentals
from gpu_share.testing.simulated_agent import AgentFactory

URL = HELLO_WORLD["model_url"]


def test_bodies_carry_require_verified_only_when_it_is_not_the_default() -> None:
    body, _ = _api.build_invoke("onnx_cpu", URL, "", {"require_verified": True})
    assert body["require_verified"] is True
    body, _ = _api.build_invoke("onnx_cpu", URL, "", {})
    assert "require_verified" not in body
    assert "require_verified" not in _reservations.request_body({"hours": 1})  # true: default
    assert (
        _reservations.request_body({"hours": 1, "require_verified": False})["require_verified"]
        is False
    )
    session = SessionCreate(runtime="onnx_cpu", model_url=URL, require_verified=True)
    assert "require_verified" not in (_sessions._defaults_left_out(session) or set())
    plain = SessionCreate(runtime="onnx_cpu", model_url=URL)
    assert _sessions._defaults_left_out(plain) == {"gpus", "require_verified"}


async def test_require_verified_invokes_and_reservations_from_the_sdk(
    sdk: AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory, rentals: Rentals
) -> None:
    await sim_agent()  # a CPU node no challenge has proven
    with pytest.raises(NoCapacity) as refused:
        await sdk.invoke("onnx_cpu", URL, require_verified=True)
    assert refused.value.details == {"constraint": "verified"}
    assert (await sdk.invoke("onnx_cpu", URL)).status.value == "queued"

    unproven = await rentals.node(count=1, verified=False)
    assert unproven.node_id is not None
    await rentals.top_up(tenant, "20")
    with pytest.raises(ValidationError) as not_proven:  # 422: valid, but not proven
        await sdk.reserve(node_id=unproven.node_id, hours=1)
    assert not_proven.value.details["constraint"] == "verified"
    nodes = {n.id: n for n in await sdk.nodes()}
    assert nodes[unproven.node_id].verified is False
    assert [g.verified for g in nodes[unproven.node_id].gpus] == [False]
