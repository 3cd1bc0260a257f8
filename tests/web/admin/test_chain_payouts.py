"""The pages of USDC payouts sent on Solana: the admin approves one above the limits
from the Payouts page; the provider sees its signature with an explorer link."""

import re

import httpx
from fastapi import FastAPI

from gpu_share.coordinator.services.money.chain_sending import Outcome
from gpu_share.testing.factories import TEST_ADMIN_KEY, ProviderHandle
from gpu_share.testing.solana_rpc import SolanaNode
from tests.coordinator.services.money import test_chain_payouts as on_chain
from tests.coordinator.services.money.test_chain_payouts import (
    EXPLORER,
    chain_row,
    make_payout,
    run,
)

# The node, its payout key and the settings that point the app at it.
node, chain, payout_key, settings = (
    on_chain.node,
    on_chain.chain,
    on_chain.payout_key,
    on_chain.settings,
)


async def sign_in(client: httpx.AsyncClient, key: str) -> str:
    """Signs in; the CSRF token of the signed-in pages' forms."""
    form = await client.get("/signin")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert csrf is not None
    done = await client.post("/signin", data={"csrf": csrf.group(1), "key": key})
    assert done.status_code == 303, done.text
    page = await client.get("/admin/payouts" if key == TEST_ADMIN_KEY else "/provider/payouts")
    token = re.search(r'name="csrf" value="([^"]+)"', page.text)
    return token.group(1) if token else ""


async def test_the_admin_approves_a_payout_above_the_limit_from_the_payouts_page(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, chain: SolanaNode
) -> None:
    big, wallet = await make_payout(app, client, provider, 600_000_000)
    assert await run(app) == {}
    csrf = await sign_in(client, TEST_ADMIN_KEY)
    page = await client.get("/admin/payouts")
    assert page.status_code == 200
    assert f'action="/admin/payouts/{big}/approve"' in page.text and "600" in page.text

    forged = await client.post(f"/admin/payouts/{big}/approve", data={"csrf": "forged"})
    assert forged.status_code == 403
    assert (await chain_row(app, big)).state == "awaiting_approval"

    done = await client.post(f"/admin/payouts/{big}/approve", data={"csrf": csrf})
    assert done.status_code == 303
    assert (await chain_row(app, big)).state == "sending"
    again = await client.post(f"/admin/payouts/{big}/approve", data={"csrf": csrf})
    assert again.status_code == 303  # told, on the page, that it is no longer waiting
    shown = await client.get("/admin/payouts")
    assert "Not approved" in shown.text and "only a payout awaiting approval" in shown.text

    assert await run(app) == {big: Outcome.SENT}
    signature = (await chain_row(app, big)).signature
    assert signature is not None
    assert EXPLORER.replace("{signature}", signature) in (await client.get("/admin/payouts")).text
    assert chain.balance(wallet) == 600_000_000


async def test_the_provider_sees_the_signature_with_an_explorer_link(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle
) -> None:
    pid, _ = await make_payout(app, client, provider, 2_000_000)
    assert await run(app) == {pid: Outcome.SENT}
    await sign_in(client, provider.key)
    signature = (await chain_row(app, pid)).signature
    assert signature is not None
    link = EXPLORER.replace("{signature}", signature)
    sending = (await client.get("/provider/payouts")).text
    assert "being sent on Solana" in sending and signature in sending

    assert await run(app) == {pid: Outcome.PAID}
    paid = (await client.get("/provider/payouts")).text
    assert f'href="{link}"' in paid.replace("&amp;", "&") and "Finalized on Solana" in paid
