"""Provider applications and their review (SPEC §3.1, §3.5), every decision mailed."""

import asyncio
from typing import Any

import httpx
import pytest

from gpu_share.coordinator.core.ids import new_id
from gpu_share.testing.factories import ADMIN, bearer
from gpu_share.testing.simulated_agent import SimulatedAgent

SCHEDULED = {
    "always": False,
    "timezone": "Europe/Berlin",
    "windows": [{"days": ["mon", "tue", "wed", "thu", "fri"], "start": "08:00", "end": "20:00"}],
}
APPLICATION: dict[str, Any] = {
    "full_name": "Anna Schmidt",
    "email": "Anna@Example.com",
    "company": "Schmidt Compute GmbH",
    "gpus": [
        {
            "model": "h100-80gb",
            "count": 8,
            "system_ram_gb": 1024,
            "internet_up_gbps": 10,
            "internet_down_gbps": 10,
            "location": "Frankfurt, Germany",
        },
        {
            "model": "other",
            "other_model": "NVIDIA B200",
            "count": 2,
            "system_ram_gb": 512,
            "internet_up_gbps": 1,
            "internet_down_gbps": 2.5,
            "availability": SCHEDULED,
            "location": "Berlin",
        },
    ],
    "ups": True,
    "commitment_months": 12,
    "maintenance_notes": "2-hour window the first Sunday of each month",
}


async def apply(client: httpx.AsyncClient, **change: Any) -> httpx.Response:
    return await client.post("/v1/provider/applications", json={**APPLICATION, **change})


async def outbox(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    mails: list[dict[str, Any]] = (await client.get("/v1/admin/outbox", headers=ADMIN)).json()
    return mails


async def test_gpu_models_list_the_supported_cards_with_their_figures(
    client: httpx.AsyncClient,
) -> None:
    models = (await client.get("/v1/provider/gpu-models")).json()
    ids = {m["id"] for m in models}
    assert {"h100-80gb", "a100-40gb", "a100-80gb", "l40s-48gb", "l4-24gb"} <= ids
    assert {"rtx-4090-24gb", "rtx-a6000-48gb"} <= ids
    h100 = next(m for m in models if m["id"] == "h100-80gb")
    assert h100["vram_gb"] == 80 and h100["memory_bandwidth_gbs"] > 3000


async def test_apply_follow_amend_approve_and_claim(client: httpx.AsyncClient) -> None:
    submitted = await apply(client)
    assert submitted.status_code == 201, submitted.text
    receipt = submitted.json()
    assert receipt["status"] == "pending" and receipt["email"] == "anna@example.com"
    token = receipt["status_token"]
    assert token.startswith("gpu_st_") and receipt["status_url"].endswith(token)
    received = await outbox(client)
    assert [m["subject"] for m in received] == ["We received your application to provide GPUs"]
    assert receipt["status_url"] in received[0]["body"]

    status = await client.get(f"/v1/provider/applications/status/{token}")
    assert status.json()["gpus"][1]["availability"]["timezone"] == "Europe/Berlin"
    early = await client.put(f"/v1/provider/applications/status/{token}", json=APPLICATION)
    assert early.status_code == 409  # nothing was asked for yet

    app_id = receipt["id"]
    asked = await client.post(
        f"/v1/admin/provider-applications/{app_id}/request-info",
        json={"message": "Which PCIe generation are the B200s on?"},
        headers=ADMIN,
    )
    assert asked.json()["status"] == "info_requested"
    info_mail = (await outbox(client))[0]
    assert "PCIe generation" in info_mail["body"] and token in info_mail["body"]
    seen = (await client.get(f"/v1/provider/applications/status/{token}")).json()
    assert seen["message"] == "Which PCIe generation are the B200s on?"

    amended = await client.put(
        f"/v1/provider/applications/status/{token}",
        json={**APPLICATION, "maintenance_notes": "PCIe 5.0; window first Sunday"},
    )
    assert amended.json()["status"] == "pending"

    approved = await client.post(
        f"/v1/admin/provider-applications/{app_id}/approve",
        json={"tier": "enterprise"},
        headers=ADMIN,
    )
    assert approved.status_code == 200, approved.text
    claim_url = approved.json()["claim_url"]
    approval_mail = (await outbox(client))[0]
    assert claim_url in approval_mail["body"] and "install.sh" in approval_mail["body"]
    claim_token = claim_url.rsplit("/", 1)[1]

    claimed = await client.post(f"/v1/provider/claim/{claim_token}")
    assert claimed.status_code == 200, claimed.text
    credentials = claimed.json()
    assert credentials["api_key"].startswith("gpu_pk_")
    assert credentials["enrollment_token"] in credentials["install_command"]
    again = await client.post(f"/v1/provider/claim/{claim_token}")
    assert again.status_code == 409  # the key was shown once

    me = await client.get("/v1/provider/me", headers=bearer(credentials["api_key"]))
    assert me.json()["tier"] == "enterprise" and me.json()["name"] == "Schmidt Compute GmbH"
    agent = SimulatedAgent("http://testserver", transport=client._transport)
    node_id = await agent.register(credentials["enrollment_token"])
    await agent.heartbeat()
    nodes = await client.get(
        "/v1/provider/nodes",
        params={"history_minutes": 5},
        headers=bearer(credentials["api_key"]),
    )
    assert [(n["id"], n["status"]) for n in nodes.json()] == [(node_id, "online")]
    assert len(nodes.json()[0]["recent"]) == 1
    await agent.aclose()


async def test_enterprise_needs_a_ups(client: httpx.AsyncClient) -> None:
    app_id = (await apply(client, ups=False)).json()["id"]
    refused = await client.post(
        f"/v1/admin/provider-applications/{app_id}/approve",
        json={"tier": "enterprise"},
        headers=ADMIN,
    )
    assert refused.status_code == 422
    assert "UPS" in refused.json()["error"]["message"]
    community = await client.post(
        f"/v1/admin/provider-applications/{app_id}/approve",
        json={"tier": "community"},
        headers=ADMIN,
    )
    assert community.json()["application"]["tier"] == "community"


async def test_rejection_is_final_and_mailed_with_its_reason(client: httpx.AsyncClient) -> None:
    receipt = (await apply(client)).json()
    rejected = await client.post(
        f"/v1/admin/provider-applications/{receipt['id']}/reject",
        json={"reason": "We are not onboarding B200s yet"},
        headers=ADMIN,
    )
    assert rejected.json()["status"] == "rejected"
    assert "not onboarding B200s" in (await outbox(client))[0]["body"]
    twice = await client.post(
        f"/v1/admin/provider-applications/{receipt['id']}/approve",
        json={"tier": "community"},
        headers=ADMIN,
    )
    assert twice.status_code == 409
    reapply = await apply(client)  # a closed application does not block a new one
    assert reapply.status_code == 201


async def test_a_second_open_application_for_the_same_email_is_refused(
    client: httpx.AsyncClient,
) -> None:
    assert (await apply(client)).status_code == 201
    second = await apply(client, email="ANNA@example.com ")
    assert second.status_code == 409
    assert "already under review" in second.json()["error"]["message"]


async def test_concurrent_applications_for_one_email_make_one(client: httpx.AsyncClient) -> None:
    answers = await asyncio.gather(*(apply(client) for _ in range(5)))
    assert sorted(a.status_code for a in answers) == [201, 409, 409, 409, 409]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"gpus": []}, "gpus"),
        ({"email": "not-an-email"}, "email"),
        ({"commitment_months": 5}, "commitment_months"),
        ({"gpus": [{**APPLICATION["gpus"][0], "model": "tpu-v5"}]}, "gpus.0.model"),
        ({"gpus": [{**APPLICATION["gpus"][0], "model": "other"}]}, "gpus.0"),
        ({"gpus": [{**APPLICATION["gpus"][0], "count": 0}]}, "gpus.0.count"),
        (
            {
                "gpus": [
                    {
                        **APPLICATION["gpus"][1],
                        "availability": {**SCHEDULED, "timezone": "Mars/Base"},
                    }
                ]
            },
            "gpus.0.availability.timezone",
        ),
        (
            {
                "gpus": [
                    {
                        **APPLICATION["gpus"][1],
                        "availability": {
                            **SCHEDULED,
                            "windows": [{"days": ["mon"], "start": "20:00", "end": "08:00"}],
                        },
                    }
                ]
            },
            "gpus.0.availability.windows.0",
        ),
    ],
)
async def test_invalid_applications_name_the_field(
    client: httpx.AsyncClient, change: dict[str, Any], field: str
) -> None:
    response = await apply(client, **change)
    assert response.status_code == 422, response.text
    locations = [
        ".".join(d["loc"][1:] if d["loc"][0] == "body" else d["loc"])
        for d in response.json()["error"]["details"]
    ]
    assert any(loc.startswith(field) for loc in locations), locations


async def test_status_links_and_claims_cannot_be_forged(client: httpx.AsyncClient) -> None:
    receipt = (await apply(client)).json()
    forged = receipt["status_token"][:-3] + "abc"
    assert (await client.get(f"/v1/provider/applications/status/{forged}")).status_code == 404
    other = "gpu_st_" + new_id("papp") + ".AAAAAAAAAAAAAAAAAAAAAAAAAAA"
    assert (await client.get(f"/v1/provider/applications/status/{other}")).status_code == 404
    assert (await client.post("/v1/provider/claim/gpu_ct_" + "x" * 43)).status_code == 404
    unknown = await client.post(
        f"/v1/admin/provider-applications/{new_id('papp')}/reject",
        json={"reason": "x"},
        headers=ADMIN,
    )
    assert unknown.status_code == 404


async def test_a_provider_key_reads_only_its_own_machines(client: httpx.AsyncClient) -> None:
    tenant = await client.post(
        "/v1/admin/tenants", json={"name": "T", "email": "t@example.com"}, headers=ADMIN
    )
    refused = await client.get("/v1/provider/nodes", headers=bearer(tenant.json()["api_key"]))
    assert refused.status_code == 403
