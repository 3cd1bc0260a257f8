"""The mails a provider gets about a payout: made, paid, failed (plain text)."""

from gpu_share.coordinator.core.orm import PayoutRow, ProviderRow
from gpu_share.coordinator.services.mail.mails import SIGNATURE
from gpu_share.coordinator.services.mail.outbox import Mail
from gpu_share.protocol.money import usdc_text


def method_words(method: dict[str, object]) -> str:
    if method.get("kind") == "solana_usdc":
        return f"USDC on Solana to {method.get('address')}"
    iban = str(method.get("iban", ""))
    return f"bank transfer to {method.get('account_holder')}, IBAN ending {iban[-4:]}"


def _where(base_url: str) -> str:
    if base_url:
        return f"Your payouts: {base_url}/provider/payouts\n"
    return "Your payouts are under Payouts when you sign in to GPU Share.\n"


def _hello(provider: ProviderRow) -> str:
    return f"Hello {provider.name},\n\n"


def created(provider: ProviderRow, payout: PayoutRow, base_url: str) -> Mail:
    amount = usdc_text(payout.amount_micro)
    return Mail(
        to=provider.email,
        subject=f"Payout of {amount} USDC on its way",
        body=_hello(provider) + f"we are paying out {amount} USDC of your earnings by "
        f"{method_words(payout.method)}.\n\n"
        "You will get another mail with the transaction reference once it is paid.\n\n"
        + _where(base_url)
        + SIGNATURE,
    )


def paid(provider: ProviderRow, payout: PayoutRow, base_url: str) -> Mail:
    amount = usdc_text(payout.amount_micro)
    return Mail(
        to=provider.email,
        subject=f"Payout of {amount} USDC paid",
        body=_hello(provider) + f"your payout of {amount} USDC by "
        f"{method_words(payout.method)} is paid.\n\n"
        f"Transaction reference: {payout.reference}\n\n" + _where(base_url) + SIGNATURE,
    )


def failed(provider: ProviderRow, payout: PayoutRow, base_url: str) -> Mail:
    amount = usdc_text(payout.amount_micro)
    return Mail(
        to=provider.email,
        subject=f"Payout of {amount} USDC failed: the amount is back in your balance",
        body=_hello(provider) + f"your payout of {amount} USDC by "
        f"{method_words(payout.method)} could not be made.\n\n"
        f"The reason: {payout.failure_reason}\n\n"
        "The amount is back in your pending balance and is paid with your next payout. "
        "If the payout method is wrong, correct it under Payouts before then.\n\n"
        + _where(base_url)
        + SIGNATURE,
    )
