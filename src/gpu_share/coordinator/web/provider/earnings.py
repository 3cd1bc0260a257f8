"""Provider dashboard: Earnings (this week and month, per GPU and per GPU model, by day
and charge by charge over a date range, the pending balance split into held, with the
days it becomes payable, and payable, a CSV of the range)."""

from datetime import UTC, date

from fastapi import APIRouter
from fastapi.responses import Response

from gpu_share.coordinator.core.errors import ValidationFailed
from gpu_share.coordinator.services.money import earnings, payouts
from gpu_share.coordinator.services.money.earnings_hold import HoldPolicy
from gpu_share.coordinator.services.money.payout_calendar import month_start, week_start
from gpu_share.coordinator.web import charts
from gpu_share.coordinator.web.pages import SignedProvider
from gpu_share.protocol.money import to_micro

router = APIRouter(prefix="/provider", include_in_schema=False)


def _day(value: str | None, name: str, errors: dict[str, str]) -> date | None:
    if not value:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        errors[name] = "must be a date such as 2026-12-01"
        return None


@router.get("/earnings")
async def earnings_page(
    signed: SignedProvider, since: str | None = None, until: str | None = None
) -> Response:
    browser, provider = signed
    replica = browser.replica
    errors: dict[str, str] = {}
    first, last = _day(since, "since", errors), _day(until, "until", errors)
    now = browser.now()
    hold = HoldPolicy.of(replica.settings)
    async with replica.db.read() as session:
        try:
            found = await earnings.earnings(
                session, provider.provider_id, now, first, last, hold=hold
            )
        except ValidationFailed as exc:
            name, _, message = exc.message.partition(": ")
            errors[name if name in ("since", "until") else "since"] = message
        if errors:  # show the default range beside the problem, and what was entered
            found = await earnings.earnings(session, provider.provider_id, now, hold=hold)
        settings = await payouts.get_settings(
            session,
            provider.provider_id,
            now.astimezone(UTC).date(),
            replica.settings.payout_minimum_micro,
        )
    chart = charts.daily_bars("Earned per day", [(d.day, to_micro(d.amount)) for d in found.daily])
    return browser.render(
        "provider/earnings.html",
        status=422 if errors else 200,
        e=found,
        payout=settings,
        errors=errors,
        entered={
            "since": since or found.since.isoformat(),
            "until": until or found.until.isoformat(),
        },
        chart=chart,
        best_day=max(found.daily, key=lambda d: to_micro(d.amount), default=None),
        commission_pct=replica.settings.commission_bps / 100,
        today=now.astimezone(UTC).date(),
        hold_days=replica.settings.earnings_hold_days,
        enterprise_hold_days=replica.settings.earnings_hold_days_enterprise,
        week_start=week_start(now),
        month_start=month_start(now),
        page_csv_url=f"/provider/earnings.csv?since={found.since}&until={found.until}",
    )


@router.get("/earnings.csv")
async def earnings_csv(
    signed: SignedProvider, since: str | None = None, until: str | None = None
) -> Response:
    """The same CSV as the API's, for the signed-in browser (the API wants a key)."""
    browser, provider = signed
    errors: dict[str, str] = {}
    first, last = _day(since, "since", errors), _day(until, "until", errors)
    async with browser.replica.db.read() as session:
        name, content = await earnings.earnings_csv(
            session,
            provider.provider_id,
            browser.now(),
            first,
            last,
            hold=HoldPolicy.of(browser.replica.settings),
        )
    return browser.finish(
        Response(
            content,
            media_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )
    )
