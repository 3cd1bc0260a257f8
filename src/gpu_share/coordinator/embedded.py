"""The single-machine setup behind `gpu-share up`: credentials kept in the data directory.

In embedded mode the admin and demo tenant keys are written to
`<data_dir>/credentials.json` (mode 0600) on first start so that `up` can print them
every time; the database still stores only their hashes. Production servers never
write keys to disk.
"""

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from sqlalchemy import select

from gpu_share.coordinator import migrate
from gpu_share.coordinator.core import keys
from gpu_share.coordinator.core.clock import Clock
from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.orm import ApiKeyRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.accounts import accounts
from gpu_share.coordinator.services.providers import enrollment_tokens, providers
from gpu_share.protocol.accounts import Role, TenantCreate
from gpu_share.protocol.providers import ProviderCreate

DEMO_TENANT = TenantCreate(name="Demo tenant", email="demo@localhost.localdomain")
LOCAL_PROVIDER = ProviderCreate(name="This machine", email="provider@localhost.localdomain")


@dataclass
class Credentials:
    admin_key: str
    tenant_id: str
    tenant_key: str
    enrollment_token: str


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
            if token != creds.enrollment_token:
                creds.enrollment_token = token
                _save(path, creds)
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
        )
        _save(path, creds)
        return creds
    finally:
        await db.dispose()
