"""A NO_CAPACITY says in a sentence why no machine can take the request: what was asked,
which part of it nobody online meets, what the closest machine has, and what would work
(services/nodes/shortfall.py); `details.constraint` still names the constraint."""

from typing import Any

import httpx
import pytest

from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.factories import TenantHandle
from gpu_share.testing.rentals import Rentals
from gpu_share.testing.simulated_agent import H100, AgentFactory, inventory
from tests.coordinator.services.work.test_leases import CPU_HELLO

GPU_HELLO = {**CPU_HELLO, "runtime": "onnx_cuda"}


def no_capacity(answer: httpx.Response, constraint: str) -> str:
    assert answer.status_code == 503, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["details"]["constraint"]) == ("NO_CAPACITY", constraint)
    assert answer.headers["Retry-After"] == "30"
    message: str = error["message"]
    return message


async def test_a_reservation_quote_with_only_cpu_machines_online_says_none_has_a_gpu(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    await sim_agent(inventory(runtimes=[RuntimeName.ONNX_CPU, RuntimeName.CATBOOST_CPU]))
    quoted = await client.post("/v1/reservations/quote", json={"hours": 1}, headers=tenant.headers)
    assert no_capacity(quoted, "runtime") == (
        "No machine online right now can take a reservation of 1 GPU for the whole period: "
        "the one machine online offers no GPU (it runs catboost_cpu, onnx_cpu). "
        "Try again later."
    )


@pytest.mark.parametrize(
    ("ask", "constraint", "sentence"),
    [
        (
            {"gpus": 3},
            "gpus",
            "No machine online right now can take a reservation of 3 GPUs for the whole "
            "period: the closest has 2 GPUs. Ask for 2 GPUs, or try again later.",
        ),
        (
            {"min_vram_gb": 100},
            "gpus",
            "No machine online right now can take a reservation of 1 GPU with at least 100 GB "
            "of GPU memory for the whole period: the closest has 85.5 GB. Ask for 85.5 GB or "
            "less, or try again later.",
        ),
        (
            {"gpu_model": "A100"},
            "gpus",
            "No machine online right now can take a reservation of 1 A100 GPU for the whole "
            "period: none has a GPU of model A100 (they have NVIDIA H100 80GB HBM3). Ask for "
            "one of those models, or try again later.",
        ),
        (
            {"max_price": "1.5"},
            "max_price_per_gpu_hour",
            "No machine online right now can take a reservation of 1 GPU for at most 1.5 USDC "
            "per GPU-hour, for the whole period: the cheapest asks 2 USDC per GPU-hour. Pay up "
            "to 2 USDC per GPU-hour, or try again later.",
        ),
        (
            {"region": "us-east"},
            "region",
            "No machine online right now can take a reservation of 1 GPU in region us-east, "
            "for the whole period: none is in region us-east (they are in eu-west). Leave the "
            "region out, or try again later.",
        ),
    ],
)
async def test_a_reservation_quote_says_which_requirement_nobody_meets_and_what_would(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    rentals: Rentals,
    ask: dict[str, Any],
    constraint: str,
    sentence: str,
) -> None:
    await rentals.node(count=2, region="eu-west")  # 2 proven H100s at 2 USDC per GPU-hour
    body = {"hours": 1, **ask}
    quoted = await client.post("/v1/reservations/quote", json=body, headers=tenant.headers)
    assert no_capacity(quoted, constraint) == sentence
    fits = await client.post("/v1/reservations/quote", json={"hours": 1}, headers=tenant.headers)
    assert fits.status_code == 200, fits.text  # the sentence was about the ask, not the node


async def test_an_invoke_for_a_gpu_runtime_on_cpu_machines_suggests_the_cpu_twin(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    refused = await client.post("/v1/gpu/invoke", json=GPU_HELLO, headers=tenant.headers)
    assert no_capacity(refused, "online") == (
        "No machine is online right now to run onnx_cuda on 1 GPU. Try again later: machines "
        "come online as their providers start them."
    )
    await sim_agent()
    await sim_agent()
    refused = await client.post("/v1/gpu/invoke", json=GPU_HELLO, headers=tenant.headers)
    assert no_capacity(refused, "runtime") == (
        "No machine online right now can run onnx_cuda on 1 GPU: none of the 2 machines "
        "online runs onnx_cuda (they run onnx_cpu). Try onnx_cpu, which runs on CPUs, or try "
        "again later."
    )


async def test_an_invoke_quote_names_the_gpu_count_memory_and_reliability_within_reach(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    await sim_agent(inventory(runtimes=[RuntimeName.ONNX_CUDA], gpus=[H100, H100]), verified=True)

    async def quote(**change: Any) -> httpx.Response:
        body = {**GPU_HELLO, **change}
        return await client.post("/v1/gpu/quote", json=body, headers=tenant.headers)

    assert no_capacity(await quote(gpus=4, min_vram_gb=80), "gpus") == (
        "No machine online right now can run onnx_cuda on 4 GPUs with at least 80 GB of GPU "
        "memory each: the closest has 2 that fit. Ask for 2 GPUs, or try again later."
    )
    assert no_capacity(await quote(min_reliability=0.99), "min_reliability") == (
        "No machine online right now can run onnx_cuda on 1 GPU with a reliability score of "
        "at least 99 %: the most reliable has 90 %. Ask for 90 % or less, or try again later."
    )
    assert no_capacity(await quote(tier="enterprise"), "tier") == (
        "No machine online right now can run onnx_cuda on 1 GPU at the enterprise tier: none "
        "is at the enterprise tier (they are community). Leave the tier out, or try again "
        "later."
    )
    assert (await quote(gpus=2, min_reliability=0.9)).status_code == 200
