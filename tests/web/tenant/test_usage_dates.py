"""The usage page says which date to fix, beside that date."""

import httpx

from gpu_share.testing.factories import TenantHandle
from tests.web.tenant.test_usage_refunds import sign_in, text_of


async def test_a_date_past_the_calendar_is_refused_beside_its_own_field(
    client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    await sign_in(client, tenant.key)
    for query, field, fix in (
        ("to=9999-12-31", "to", "must be on or before"),  # once a 500 (OverflowError)
        ("from=1999-12-31", "from", "must be on or after 2000-01-01"),
        ("from=2026-12-02&to=2026-12-01", "from", "must be on or before to (2026-12-01)"),
    ):
        page = await client.get(f"/console/usage?{query}")
        assert page.status_code == 422, (query, page.text[:300])  # the page, with what to fix
        said = page.text.split(f'id="{field}-error">', 1)
        assert len(said) == 2, query  # the message stands beside the field it names
        assert text_of(said[1].split("</p>", 1)[0]).startswith(fix), query


async def test_an_unreadable_date_is_the_only_one_said_wrong(
    client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    """A valid date beside one that cannot be read is not judged against today instead
    (it once said "from must be on or before to (today)")."""
    await sign_in(client, tenant.key)
    page = await client.get("/console/usage?from=2099-01-01&to=soon")
    assert page.status_code == 422
    said = page.text.split('id="to-error">', 1)
    assert len(said) == 2
    assert text_of(said[1].split("</p>", 1)[0]).startswith("Give a date as YYYY-MM-DD")
    assert 'id="from-error">' not in page.text
