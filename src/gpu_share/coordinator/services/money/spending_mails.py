"""The mails a tenant gets about its own limits: the balance fell below its threshold,
the month's spend reached its cap (plain text)."""

from gpu_share.coordinator.core.orm import TenantRow
from gpu_share.coordinator.services.mail.mails import SIGNATURE
from gpu_share.coordinator.services.mail.outbox import Mail
from gpu_share.protocol.money import usdc_text


def _where(base_url: str) -> str:
    return f"Your usage and limits: {base_url}/console/usage\n"


def low_balance(tenant: TenantRow, available: int, threshold: int, base_url: str) -> Mail:
    return Mail(
        to=tenant.email,
        subject=f"Your GPU Share balance is below {usdc_text(threshold)} USDC",
        body=f"Hello {tenant.name},\n\n"
        f"your available balance is {usdc_text(available)} USDC, below the "
        f"{usdc_text(threshold)} USDC you asked to be told about.\n\n"
        "New work that the balance cannot cover is refused (402 INSUFFICIENT_BALANCE); "
        "work already running goes on. Top up to keep going. We mail again only after "
        "the balance has risen to the threshold and falls below it once more.\n\n"
        + _where(base_url)
        + SIGNATURE,
    )


def cap_reached(tenant: TenantRow, cap: int, spent: int, month: str, base_url: str) -> Mail:
    return Mail(
        to=tenant.email,
        subject=f"Your GPU Share spending cap of {usdc_text(cap)} USDC is reached for {month}",
        body=f"Hello {tenant.name},\n\n"
        f"{usdc_text(spent)} USDC is spent or held for running work in {month} (UTC), "
        f"and your monthly cap is {usdc_text(cap)} USDC: new work that could take the "
        "month past it is refused (402 SPENDING_LIMIT) until the month ends. Work "
        "already running goes on.\n\n"
        "To go on now, raise or remove the cap on the Usage page, or with "
        "PUT /v1/billing/limits. This is the only mail about the cap this month.\n\n"
        + _where(base_url)
        + SIGNATURE,
    )
