"""`gpu-share reservations`: output and exit codes against the coordinator on a real port,
with a simulated GPU node priced per GPU-hour and a tenant with a balance."""

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from fastapi import FastAPI

from gpu_share.cli.main import main
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import TenantHandle
from gpu_share.testing.rentals import MODEL, Rentals
from gpu_share.testing.servers import serve


@pytest.fixture(autouse=True)
def no_ambient_config(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GPU_SHARE_BASE_URL", "GPU_SHARE_API_KEY", "GPU_SHARE_POLL_INTERVAL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def node(tenant: TenantHandle, rentals: Rentals) -> str:
    """The id of a registered node with 2 GPUs, the tenant topped up."""
    agent = await rentals.node(count=2)
    await rentals.top_up(tenant, "20")
    assert agent.node_id is not None
    return agent.node_id


@pytest.fixture
async def base_url(app: FastAPI) -> AsyncIterator[str]:
    async with serve(app, lifespan=False) as url:
        yield url


async def gpu_share(
    capsys: pytest.CaptureFixture[str], base_url: str, key: str, *argv: str
) -> tuple[int, str, str]:
    code = await asyncio.to_thread(
        main, ["reservations", *argv, "--base-url", base_url, "--api-key", key]
    )
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def test_quote_create_list_show_and_cancel(
    node: str,
    base_url: str,
    tenant: TenantHandle,
    clock: FrozenClock,
    capsys: pytest.CaptureFixture[str],
) -> None:
    later = (clock.now() + timedelta(hours=1)).replace(second=0)
    request = ("--node", node, "--gpus", "2", "--start", later.isoformat(), "--hours", "3")

    code, out, _ = await gpu_share(capsys, base_url, tenant.key, "quote", *request)
    assert code == 0, out
    assert f"node:     {node} (2 x {MODEL})" in out
    assert "(3 h)" in out and "2 USDC/GPU-hour, 4 USDC/hour" in out
    assert "cost:     12 USDC" in out and "20 USDC available: covered" in out

    code, out, _ = await gpu_share(capsys, base_url, tenant.key, "create", *request, "--json")
    assert code == 0, out
    made = json.loads(out)
    assert (made["status"], made["cost"], sorted(made["gpu_indices"])) == ("pending", "12", [0, 1])

    code, out, _ = await gpu_share(capsys, base_url, tenant.key, "list")
    header, row = out.splitlines()
    assert header.split()[:4] == ["RESERVATION", "STATUS", "NODE", "GPUS"]
    assert row.split()[:4] == [made["id"], "pending", node, "2"]

    code, out, _ = await gpu_share(capsys, base_url, tenant.key, "show", made["id"])
    assert code == 0 and out.startswith(f"{made['id']}  pending\n")
    assert f"{later.strftime('%Y-%m-%d %H:%M')} UTC" in out and "cost:     12 USDC" in out

    code, out, _ = await gpu_share(capsys, base_url, tenant.key, "cancel", made["id"])
    assert code == 0 and out.startswith(f"{made['id']}  canceled\n")
    assert "cost:     0 USDC" in out and "canceled: " in out

    code, out, _ = await gpu_share(capsys, base_url, tenant.key, "list", "--json")
    assert [(r["id"], r["status"]) for r in json.loads(out)] == [(made["id"], "canceled")]


async def test_bad_or_overlapping_requests_and_anothers_reservation_exit_non_zero(
    node: str,
    base_url: str,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = await gpu_share(
        capsys, base_url, tenant.key, "create", "--node", node, "--hours", "0"
    )
    assert code == 2 and "hours: Input should be greater than or equal to 1" in err

    code, out, _ = await gpu_share(
        capsys, base_url, tenant.key, "create", "--node", node, "--gpus", "2",
        "--hours", "2", "--json",
    )  # fmt: skip
    assert code == 0, out
    mine = json.loads(out)["id"]
    code, _, err = await gpu_share(
        capsys, base_url, tenant.key, "quote", "--node", node, "--hours", "1"
    )
    assert code == 1
    assert err.startswith("gpu-share: ") and "has its GPUs reserved for part of" in err

    code, out, _ = await gpu_share(capsys, base_url, other_tenant.key, "show", mine, "--json")
    error = json.loads(out)["error"]
    assert code == 1 and (error["type"], error["code"]) == ("NotFound", "NOT_FOUND")
    assert error["message"].endswith(f"reservation {mine} does not exist")
    code, _, err = await gpu_share(capsys, base_url, other_tenant.key, "cancel", mine)
    assert code == 1 and "does not exist" in err
    code, out, _ = await gpu_share(capsys, base_url, other_tenant.key, "list")
    assert code == 0 and out.startswith("no reservations yet")
