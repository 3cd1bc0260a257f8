"""Provider dashboard: Payouts (where and how often they are paid, what is payable and
what is still held, and every payout with its status, method and transaction
reference)."""

from dataclasses import dataclass, field
from datetime import UTC

from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.datastructures import FormData

from gpu_share.coordinator.core.errors import ValidationFailed
from gpu_share.coordinator.services.money import chain_payouts, ledger, payouts
from gpu_share.coordinator.web.pages import Browser, SignedProvider, form_of, text
from gpu_share.protocol.bank_regions import describe
from gpu_share.protocol.money import usdc_text
from gpu_share.protocol.payouts import PayoutSettings, PayoutSettingsUpdate

router = APIRouter(prefix="/provider", include_in_schema=False)

FIELDS = ("kind", "schedule", "address", "account_holder", "iban", "bic")
LABELS = {
    "kind": "Method",
    "schedule": "Schedule",
    "address": "Solana address",
    "account_holder": "Account holder",
    "iban": "IBAN",
    "bic": "BIC",
}


@dataclass
class MethodForm:
    """The form's values as entered, and a message per field."""

    values: dict[str, str]
    errors: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, current: PayoutSettings) -> "MethodForm":
        values = dict.fromkeys(FIELDS, "")
        values["schedule"] = current.schedule.value
        values["kind"] = "solana_usdc"
        if current.method is not None:
            values.update({k: str(v) for k, v in current.method.model_dump().items()})
        return cls(values)


def read_method(form: FormData) -> tuple[MethodForm, PayoutSettingsUpdate | None]:
    entered = MethodForm({name: text(form, name) for name in FIELDS})
    kind = entered.values["kind"]
    if kind == "solana_usdc":
        method: dict[str, str] = {"kind": kind, "address": entered.values["address"]}
    elif kind == "bank_transfer":
        method = {k: entered.values[k] for k in ("kind", "account_holder", "iban", "bic")}
    else:
        entered.errors["kind"] = "choose USDC on Solana or a bank transfer"
        return entered, None
    try:
        change = PayoutSettingsUpdate.model_validate(
            {"method": method, "schedule": entered.values["schedule"] or "weekly"}
        )
    except ValidationError as exc:
        for error in exc.errors():
            loc = [str(part) for part in error["loc"]]
            name = next((part for part in reversed(loc) if part in LABELS), "kind")
            message = str(error["msg"]).removeprefix("Value error, ")
            if name == "schedule":
                message = "choose weekly or monthly"
            elif message.startswith("String should have at least"):
                message = f"enter the {LABELS[name].lower()}"
            entered.errors.setdefault(name, message)
        return entered, None
    return entered, change


async def _render(
    browser: Browser, provider_id: str, form: MethodForm | None, status: int = 200
) -> Response:
    replica = browser.replica
    async with replica.db.read() as session:
        current = await payouts.get_settings(
            session,
            provider_id,
            browser.now().astimezone(UTC).date(),
            replica.settings.payout_minimum_micro,
        )
        history = await chain_payouts.with_chain(
            session,
            await payouts.of_provider(session, provider_id),
            replica.settings.solana_explorer_url,
        )
        payable = await ledger.balance(session, ledger.provider_pending(provider_id))
        held = await ledger.balance(session, ledger.provider_held(provider_id))
    return browser.render(
        "provider/payouts.html",
        status=status,
        current=current,
        form=form or MethodForm.of(current),
        labels=LABELS,
        payouts=history,
        payable=usdc_text(payable),
        held=usdc_text(held),
        hold_days=replica.settings.earnings_hold_days,
        bank_regions=describe(replica.settings.bank_payout_regions),
    )


@router.get("/payouts")
async def payouts_page(signed: SignedProvider) -> Response:
    browser, provider = signed
    return await _render(browser, provider.provider_id, None)


@router.post("/payouts/settings")
async def save_payout_settings(signed: SignedProvider) -> Response:
    browser, provider = signed
    form = await form_of(browser)
    entered, change = read_method(form)
    if change is None:
        return await _render(browser, provider.provider_id, entered, status=422)
    replica = browser.replica
    try:
        async with replica.db.write() as session:
            saved = await payouts.set_settings(
                session,
                provider.provider_id,
                change,
                browser.now().astimezone(UTC).date(),
                replica.settings.payout_minimum_micro,
                bank_regions=replica.settings.bank_payout_regions,
            )
    except ValidationFailed as exc:  # an IBAN outside the regions paid by bank
        entered.errors["iban"] = exc.message.removeprefix("method.iban: ")
        return await _render(browser, provider.provider_id, entered, status=422)
    where = "USDC on Solana" if change.method.kind == "solana_usdc" else "bank transfer"
    return browser.redirect(
        "/provider/payouts",
        flash=f"Saved: {change.schedule.value} payouts by {where}; the next payout day is "
        f"{saved.next_payout_on.strftime('%A %d %B')}.",
    )
