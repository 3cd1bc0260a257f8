"""A provider's enrollment tokens on the admin's page of its nodes, over plain HTTP: issued
with a lifetime of the admin's choosing (shown once), a lifetime out of range put next to
its field, rotated and revoked; a provider's session cannot reach these forms."""

import re
from datetime import timedelta

import httpx

from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import TEST_ADMIN_KEY, ProviderHandle
from tests.web.admin.test_pages import csrf_of, signed_in


def token_ids(page: str) -> list[str]:
    return re.findall(r'id="token-(enr_[0-9a-z]+)"', page)


async def test_the_admin_issues_rotates_and_revokes_a_providers_tokens(
    client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> None:
    await signed_in(client, TEST_ADMIN_KEY)
    page = await client.get(f"/admin/nodes?provider={provider.id}")
    assert page.status_code == 200 and 'id="enrollment-tokens"' in page.text
    (first,) = token_ids(page.text)
    base = f"/admin/providers/{provider.id}/enrollment-tokens"

    too_long = await client.post(base, data={"csrf": csrf_of(page.text), "lifetime_days": "400"})
    assert too_long.status_code == 422 and 'id="lifetime_days-error"' in too_long.text
    issued = await client.post(base, data={"csrf": csrf_of(page.text), "lifetime_days": "30"})
    assert issued.status_code == 200, issued.text
    secret = re.search(r'id="new-enrollment-token">(gpu_et_[^<]+)<', issued.text)
    assert secret is not None
    until = (clock.now() + timedelta(days=30)).strftime("%Y-%m-%d")
    assert f"It works until {until}" in issued.text
    assert len(token_ids(issued.text)) == 2

    rotated = await client.post(f"{base}/{first}/rotate", data={"csrf": csrf_of(page.text)})
    assert rotated.status_code == 200 and "in place of the one just revoked" in rotated.text
    revoked = await client.post(
        f"{base}/{token_ids(issued.text)[0]}/revoke", data={"csrf": csrf_of(page.text)}
    )
    assert revoked.status_code == 303
    assert revoked.headers["location"] == f"/admin/nodes?provider={provider.id}#enrollment-tokens"
    after = (await client.get(revoked.headers["location"])).text
    assert secret.group(1) not in after  # shown that once
    assert after.count('class="revoked"') == 2 and len(token_ids(after)) == 3

    unknown = await client.post(
        f"/admin/providers/prv_{'0' * 26}/enrollment-tokens", data={"csrf": csrf_of(page.text)}
    )
    assert unknown.status_code == 404


async def test_a_providers_session_cannot_use_the_admins_token_forms(
    client: httpx.AsyncClient, provider: ProviderHandle
) -> None:
    csrf = await signed_in(client, provider.key)
    answer = await client.post(
        f"/admin/providers/{provider.id}/enrollment-tokens", data={"csrf": csrf}
    )
    assert answer.status_code == 403
