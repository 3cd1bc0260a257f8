"""Provider applications and their review (SPEC §3.1, §3.5), every decision mailed; an
application counts once its email is confirmed by the mailed link, and applying tells no
one whether the email applied before."""

import asyncio
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import select

from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import ProviderApplicationRow
from gpu_share.coordinator.loops import housekeeping
from gpu_share.testing.applications import CONFIRM_LINK, apply_as_provider, mailed_confirm_token
from gpu_share.testing.clock import FrozenClock
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


async def confirm(client: httpx.AsyncClient, email: str = "anna@example.com") -> httpx.Response:
    """Open the newest link mailed to `email`, as its owner would."""
    token = await mailed_confirm_token(client, email)
    return await client.post(f"/v1/provider/applications/confirm/{token}")


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


async def test_apply_confirm_follow_amend_approve_and_claim(client: httpx.AsyncClient) -> None:
    submitted = await apply(client)
    assert submitted.status_code == 201, submitted.text
    assert submitted.json()["email"] == "anna@example.com"
    assert "status_token" not in submitted.json()  # only the email's owner gets that
    (confirm_mail,) = await outbox(client)
    assert confirm_mail["subject"] == "Confirm your email to apply to provide GPUs"
    assert "Anna" not in confirm_mail["body"]  # no words of the applicant's to a stranger
    link = CONFIRM_LINK.search(confirm_mail["body"])
    assert link is not None, confirm_mail["body"]
    unconfirmed = await client.get("/v1/admin/provider-applications", headers=ADMIN)
    assert unconfirmed.json() == []  # not an application yet

    confirmed = await client.post(f"/v1/provider/applications/confirm/{link.group(1)}")
    assert confirmed.status_code == 200, confirmed.text
    receipt = confirmed.json()
    assert receipt["status"] == "pending" and receipt["email"] == "anna@example.com"
    token = receipt["status_token"]
    assert token.startswith("gpu_st_") and receipt["status_url"].endswith(token)
    received = await outbox(client)
    assert received[0]["subject"] == "We received your application to provide GPUs"
    assert receipt["status_url"] in received[0]["body"]
    again = await client.post(f"/v1/provider/applications/confirm/{link.group(1)}")
    assert again.json() == receipt  # the link opened twice
    assert len(await outbox(client)) == 2  # and mailed once

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
    app_id = (await apply_as_provider(client, {**APPLICATION, "ups": False}))["id"]
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
    receipt = await apply_as_provider(client, APPLICATION)
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
    reapply = await apply_as_provider(client, APPLICATION)  # a closed one blocks no new one
    assert reapply["status"] == "pending"


async def test_applying_answers_the_same_whether_or_not_the_email_has_an_application(
    client: httpx.AsyncClient,
) -> None:
    first = await apply(client)
    await apply_as_provider(client, APPLICATION)  # now one is under review
    again = await apply(client, email="ANNA@example.com ", full_name="Mallory")
    assert (first.status_code, first.json()) == (again.status_code, again.json())
    fresh = await apply(client, email="new@example.com")
    assert fresh.status_code == 201 and fresh.json().keys() == first.json().keys()


async def test_a_squatter_blocks_no_one_and_a_second_confirmation_hears_only_that_one_exists(
    client: httpx.AsyncClient,
) -> None:
    squatted = await apply(client, full_name="Mallory", company="Squat Inc")  # never confirmed
    assert squatted.status_code == 201
    owner = await apply_as_provider(client, APPLICATION)  # the email's owner, unhindered
    assert owner["status"] == "pending"
    listed = (await client.get("/v1/admin/provider-applications", headers=ADMIN)).json()
    assert [a["id"] for a in listed] == [owner["id"]]

    await apply(client, full_name="Anna Again", company=None)
    second = await confirm(client)
    assert second.status_code == 409
    message = second.json()["error"]["message"]
    assert "already has an application under review" in message
    for secret in (owner["id"], "Schmidt", "Frankfurt", owner["status_token"]):
        assert secret not in second.text  # nothing of the other application


async def test_concurrent_confirmations_for_one_email_make_one(
    client: httpx.AsyncClient,
) -> None:
    for n in range(5):
        assert (await apply(client, full_name=f"Anna {n}")).status_code == 201
    mails = [m for m in await outbox(client) if m["cause"].endswith(":confirm")]
    tokens = [link.group(1) for m in mails if (link := CONFIRM_LINK.search(m["body"]))]
    answers = await asyncio.gather(
        *(client.post(f"/v1/provider/applications/confirm/{token}") for token in tokens)
    )
    assert sorted(a.status_code for a in answers) == [200, 409, 409, 409, 409]


async def test_unconfirmed_applications_are_not_reviewed_and_are_deleted_after_a_week(
    app: FastAPI, client: httpx.AsyncClient, clock: FrozenClock
) -> None:
    await apply(client)
    await apply(client, email="late@example.com")
    (early,) = [m for m in await outbox(client) if m["to"] == "anna@example.com"]
    app_id = early["cause"].removesuffix(":confirm")
    unknown = await client.post(
        f"/v1/admin/provider-applications/{app_id}/approve",
        json={"tier": "community"},
        headers=ADMIN,
    )
    assert unknown.status_code == 404
    counts = await client.get("/v1/admin/provider-applications?status=pending", headers=ADMIN)
    assert counts.json() == []

    clock.advance(6 * 86_400)
    await apply_as_provider(client, {**APPLICATION, "email": "late@example.com"})
    clock.advance(86_400)
    await housekeeping.run_once(app.state.replica)
    gone = await confirm(client)
    assert gone.status_code == 404 and "expired" in gone.json()["error"]["message"]
    async with app.state.replica.db.read() as session:
        assert await session.get(ProviderApplicationRow, app_id) is None
        kept = await session.scalars(select(ProviderApplicationRow))
        assert [row.email for row in kept] == ["late@example.com"]  # confirmed in time


async def test_the_email_of_an_application_cannot_be_changed_by_amending_it(
    client: httpx.AsyncClient,
) -> None:
    receipt = await apply_as_provider(client, APPLICATION)
    await client.post(
        f"/v1/admin/provider-applications/{receipt['id']}/request-info",
        json={"message": "Which PCIe generation?"},
        headers=ADMIN,
    )
    moved = await client.put(
        f"/v1/provider/applications/status/{receipt['status_token']}",
        json={**APPLICATION, "email": "victim@example.com"},
    )
    assert moved.status_code == 422
    assert moved.json()["error"]["details"][0]["loc"] == ["email"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"gpus": []}, "gpus"),
        ({"email": "not-an-email"}, "email"),
        ({"email": "anna,eve@example.com"}, "email"),  # two addresses, to a mailer
        ({"email": "Eve <eve@example.com>"}, "email"),
        ({"email": "anna@exam\u0007ple.com"}, "email"),
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


async def test_links_and_claims_cannot_be_forged(client: httpx.AsyncClient) -> None:
    receipt = await apply_as_provider(client, APPLICATION)
    forged = receipt["status_token"][:-3] + "abc"
    assert (await client.get(f"/v1/provider/applications/status/{forged}")).status_code == 404
    status_as_confirm = "gpu_cf_" + receipt["status_token"].removeprefix("gpu_st_")
    confirm = await client.post(f"/v1/provider/applications/confirm/{status_as_confirm}")
    assert confirm.status_code == 404  # sealed for another purpose
    await apply(client, email="other@example.com")
    token = await mailed_confirm_token(client, "other@example.com")
    confirm_as_status = "gpu_st_" + token.removeprefix("gpu_cf_")
    assert (
        await client.get(f"/v1/provider/applications/status/{confirm_as_status}")
    ).status_code == 404
    assert (
        await client.post(f"/v1/provider/applications/confirm/{token[:-3]}abc")
    ).status_code == 404
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
