"""The single-machine setup behind `gpu-share up`: credentials kept in the data directory.

In embedded mode the admin and demo tenant keys are written to
`<data_dir>/credentials.json` (mode 0600) on first start so that `up` can print them
every time; the database still stores only their hashes. Production servers never
write keys to disk.

`up` runs prepaid with demo money (`Settings.demo_money`) so a newcomer sees prices,
charges and earnings from the first invoke: the demo tenant is credited a demo balance
once (a top-up under a fixed reference: a restart finds it and credits nothing), and the
local provider's node gets a demo price for each model it runs that has none yet.
"""

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator import migrate
from gpu_share.coordinator.core import keys
from gpu_share.coordinator.core.clock import Clock
from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.orm import ApiKeyRow, EnrollmentTokenRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.accounts import accounts
from gpu_share.coordinator.services.money import billing, ledger, tenant_billing
from gpu_share.coordinator.services.nodes import prices
from gpu_share.coordinator.services.providers import enrollment_tokens, providers
from gpu_share.protocol.accounts import Role, TenantCreate
from gpu_share.protocol.billing import TopUpCreate
from gpu_share.protocol.prices import PriceUpdate
from gpu_share.protocol.providers import ProviderCreate

DEMO_TENANT = TenantCreate(name="Demo tenant", email="demo@localhost.localdomain")
LOCAL_PROVIDER = ProviderCreate(name="This machine", email="provider@localhost.localdomain")

# Demo money: enough for thousands of example invokes, priced like a small cloud GPU.
DEMO_TOP_UP = TopUpCreate(amount="100", reference="gpu-share up: demo balance")
DEMO_GPU_PRICE = PriceUpdate(price_per_gpu_hour="2", spot_discount_pct=50)
DEMO_CPU_PRICE = PriceUpdate(price_per_gpu_hour="0.5", spot_discount_pct=50)
DEMO_BY = "gpu-share up"  # who the ledger says made the demo top-up


@dataclass
class Credentials:
    admin_key: str
    tenant_id: str
    tenant_key: str
    enrollment_token: str
    # The local provider's key, to see this machine's earnings; None in a file written
    # before `up` printed one (the next start issues it).
    provider_key: str | None = None


def credentials_path(settings: Settings) -> Path:
    return settings.data_dir / "credentials.json"


def _load(path: Path) -> Credentials | None:
    try:
        return Credentials(**json.loads(path.read_text()))
    except (FileNotFoundError, TypeError, ValueError):
        return None


def _save(path: Path, creds: Credentials) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(asdict(creds), f, indent=2)


async def _usable(db: Database, key: str) -> bool:
    async with db.read() as session:
        row = await session.scalar(
            select(ApiKeyRow).where(ApiKeyRow.key_hash == keys.hash_key(key))
        )
    return row is not None and row.revoked_at is None


async def _working_token(db: Database, settings: Settings, clock: Clock, token: str) -> str | None:
    """Tokens expire: the one on disk, or a new one for the same provider once it has."""
    async with db.write() as session:
        return await enrollment_tokens.renewed(
            session,
            token,
            clock.now(),
            enrollment_tokens.lifetime(settings.enrollment_token_days),
        )


async def prepare(settings: Settings, clock: Clock) -> Credentials:
    """Migrate, then make sure an admin key, a demo tenant key and a working enrollment
    token exist and are on disk."""
    await migrate.upgrade(settings.database_url)
    path = credentials_path(settings)
    creds = _load(path)
    db = Database(settings.database_url)
    try:
        if (
            creds is not None
            and await _usable(db, creds.admin_key)
            and await _usable(db, creds.tenant_key)
            and (token := await _working_token(db, settings, clock, creds.enrollment_token))
        ):
            provider_key = await _working_provider_key(db, clock, token, creds.provider_key)
            if (token, provider_key) != (creds.enrollment_token, creds.provider_key):
                creds.enrollment_token, creds.provider_key = token, provider_key
                _save(path, creds)
            await _credit_demo_balance(db, settings, clock, creds.tenant_id)
            return creds
        now = clock.now()
        async with db.write() as session:
            _, admin_key = await accounts.issue_key(session, Role.ADMIN, now)
            tenant = await accounts.create_tenant(session, DEMO_TENANT, now)
            provider = await providers.create_provider(
                session,
                LOCAL_PROVIDER,
                now,
                token_lifetime=enrollment_tokens.lifetime(settings.enrollment_token_days),
            )
        creds = Credentials(
            admin_key=admin_key,
            tenant_id=tenant.id,
            tenant_key=tenant.api_key,
            enrollment_token=provider.enrollment_token,
            provider_key=provider.api_key,
        )
        _save(path, creds)
        await _credit_demo_balance(db, settings, clock, creds.tenant_id)
        return creds
    finally:
        await db.dispose()


async def _local_provider(session: AsyncSession, enrollment_token: str) -> str | None:
    """The local provider: the one the local agent's enrollment token enrolls for."""
    found: str | None = await session.scalar(
        select(EnrollmentTokenRow.provider_id).where(
            EnrollmentTokenRow.token_hash == keys.hash_key(enrollment_token)
        )
    )
    return found


async def _working_provider_key(
    db: Database, clock: Clock, enrollment_token: str, key: str | None
) -> str | None:
    """The local provider's key on disk, or a new one when there is none or it was revoked."""
    if key is not None and await _usable(db, key):
        return key
    async with db.write() as session:
        provider_id = await _local_provider(session, enrollment_token)
        if provider_id is None:
            return None
        _, new_key = await accounts.issue_key(
            session, Role.PROVIDER, clock.now(), provider_id=provider_id
        )
    return new_key


async def _credit_demo_balance(
    db: Database, settings: Settings, clock: Clock, tenant_id: str
) -> None:
    """The demo tenant's demo balance, credited once: the top-up's cause is its reference,
    so a later start (even one whose demo amount changed) finds it and credits nothing."""
    if not billing.demo_money(settings):
        return
    async with db.write() as session:
        if await ledger.posted(
            session, tenant_billing.top_up_cause(tenant_id, DEMO_TOP_UP.reference)
        ):
            return
        await tenant_billing.top_up(
            session, tenant_id, DEMO_TOP_UP, idempotency_key=None, admin=DEMO_BY, now=clock.now()
        )


async def price_local_node(settings: Settings, clock: Clock, enrollment_token: str) -> list[str]:
    """A demo price for each model (or "cpu") the local provider's machines run that has
    no price yet; the models priced now. Called once the local agent has registered its
    node: a price is set only for a model a machine of the provider runs. A price the
    owner set or changed on the Pricing page is kept."""
    if not billing.demo_money(settings):
        return []
    db = Database(settings.database_url)
    try:
        async with db.write() as session:
            provider_id = await _local_provider(session, enrollment_token)
            if provider_id is None:
                return []
            listed = await prices.list_prices(session, provider_id)
            for model in listed.unpriced_models:
                demo = DEMO_CPU_PRICE if model == prices.CPU_MODEL else DEMO_GPU_PRICE
                await prices.set_price(session, provider_id, model, demo, clock.now())
            return listed.unpriced_models
    finally:
        await db.dispose()
