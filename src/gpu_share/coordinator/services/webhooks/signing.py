"""The Standard Webhooks signature: `v1,` + base64(HMAC-SHA256(key, "{id}.{timestamp}.{body}")),
where the secret is `whsec_` + base64(key). Pure functions; the SDK's verifier is the
other side (`gpu_share.sdk.verify_webhook`)."""

import base64
import hashlib
import hmac
import secrets

PREFIX = "whsec_"
KEY_BYTES = 32


def new_secret() -> str:
    return PREFIX + base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode()


def _key(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(PREFIX))


def signature(secret: str, message_id: str, timestamp: int, body: str) -> str:
    signed = f"{message_id}.{timestamp}.{body}".encode()
    digest = hmac.new(_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(
    secrets_in_force: list[str], message_id: str, timestamp: int, body: str
) -> dict[str, str]:
    """The three headers of one attempt: one signature per secret in force, space-separated
    (the current one, and the previous one during a rotation's grace period)."""
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(
            signature(secret, message_id, timestamp, body) for secret in secrets_in_force
        ),
    }
