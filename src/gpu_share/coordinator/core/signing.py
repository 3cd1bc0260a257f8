"""Tokens the coordinator signs and checks without storing them.

- Download links: a token names one artifact and an expiry, so an agent can fetch a
  tenant's artifact for a job; it grants nothing else.
- Sealed values (`seal`/`unseal`): a subject and a purpose, signed together, such as
  an applicant's status link or a browser session.

Both are HMAC-SHA256 under a key every replica shares (kept in `server_secrets`).
"""

import base64
import hashlib
import hmac
import secrets
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.errors import Unauthorized
from gpu_share.coordinator.core.orm import ServerSecretRow

SECRET_NAME = "artifact_url_signing_key"  # noqa: S105 (a row name, not a secret)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class UrlSigner:
    def __init__(self, key: bytes) -> None:
        self._key = key

    def _mac(self, message: str) -> str:
        return _b64(hmac.new(self._key, message.encode(), hashlib.sha256).digest()[:20])

    def seal(self, purpose: str, subject: str) -> str:
        """`subject` with a signature that holds only for `purpose`."""
        return f"{subject}.{self._mac(f'{purpose}:{subject}')}"

    def unseal(self, purpose: str, token: str) -> str | None:
        """The subject of a token sealed for `purpose`; None for anything else."""
        subject, _, mac = token.rpartition(".")
        if not subject or not mac:
            return None
        if not hmac.compare_digest(mac, self._mac(f"{purpose}:{subject}")):
            return None
        return subject

    def unseal_token(self, prefix: str, purpose: str, token: str) -> str | None:
        """The subject of a token that is `prefix` and a value sealed for `purpose`."""
        if not token.startswith(prefix):
            return None
        return self.unseal(purpose, token.removeprefix(prefix))

    def sign(self, artifact_id: str, expires_at: datetime) -> str:
        expiry = int(expires_at.timestamp())
        return f"{expiry}.{self._mac(f'{artifact_id}.{expiry}')}"

    def verify(self, token: str, artifact_id: str, now: datetime) -> None:
        expiry_text, _, mac = token.partition(".")
        if not expiry_text.isdigit() or not mac:
            raise Unauthorized("malformed download token")
        if not hmac.compare_digest(mac, self._mac(f"{artifact_id}.{expiry_text}")):
            raise Unauthorized("download token is not valid for this artifact")
        if int(expiry_text) < now.timestamp():
            raise Unauthorized(
                "download token expired; the agent gets a new one with its next lease"
            )


async def load_signer(db: Database, now: datetime) -> UrlSigner:
    """The shared signing key, created by whichever replica starts first."""
    async with db.read() as session:
        value = await _stored(session)
    if value is None:
        try:
            async with db.write() as session:
                session.add(
                    ServerSecretRow(name=SECRET_NAME, value=secrets.token_hex(32), created_at=now)
                )
        except IntegrityError:
            pass  # another replica won the race; use its key
        async with db.read() as session:
            value = await _stored(session)
    assert value is not None
    return UrlSigner(bytes.fromhex(value))


async def _stored(session: AsyncSession) -> str | None:
    return await session.scalar(
        select(ServerSecretRow.value).where(ServerSecretRow.name == SECRET_NAME)
    )
