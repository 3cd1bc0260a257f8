"""Verifying a webhook GPU Share sent (Standard Webhooks), with the standard library only.

from gpu_share.sdk import verify_webhook

event = verify_webhook(secret, request.headers, request.body)   # or raises
if event["type"] == "invoke.done": ...
"""

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any

from gpu_share.sdk.errors import WebhookVerificationError

SECRET_PREFIX = "whsec_"  # noqa: S105 (the format's prefix, not a secret)


def _header(headers: Mapping[str, str], name: str) -> str:
    for key, value in headers.items():
        if key.lower() == name:
            return value
    raise WebhookVerificationError(f"the {name} header is missing; is this a GPU Share webhook?")


def _key(secret: str) -> bytes:
    try:
        return base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except (binascii.Error, ValueError):
        raise WebhookVerificationError(
            "the secret is not a whsec_… signing secret as GPU Share shows it"
        ) from None


def verify_webhook(
    secret: str,
    headers: Mapping[str, str],
    body: bytes | str,
    *,
    tolerance: int = 300,
    now: float | None = None,
) -> dict[str, Any]:
    """The event (`type`, `timestamp`, `data`) when `body` was signed with `secret` within
    `tolerance` seconds of `now`; else `WebhookVerificationError` saying why.

    Pass the body exactly as received (bytes), not re-serialized JSON. Keep the
    `webhook-id` header to drop a delivery you have already handled (retries and replays
    keep it)."""
    message_id = _header(headers, "webhook-id")
    stamp_text = _header(headers, "webhook-timestamp")
    signatures = _header(headers, "webhook-signature")
    try:
        stamp = int(stamp_text)
    except ValueError:
        raise WebhookVerificationError(
            f"webhook-timestamp {stamp_text!r} is not unix seconds"
        ) from None
    current = time.time() if now is None else now
    if stamp < current - tolerance:
        raise WebhookVerificationError(
            f"the webhook is too old: signed {int(current - stamp)} s ago, over the "
            f"{tolerance} s tolerance (a replayed request, or this clock is wrong)"
        )
    if stamp > current + tolerance:
        raise WebhookVerificationError(
            f"the webhook is too new: signed {int(stamp - current)} s ahead of this clock"
        )
    raw = body.encode() if isinstance(body, str) else body
    signed = message_id.encode() + b"." + str(stamp).encode() + b"." + raw
    expected = base64.b64encode(hmac.new(_key(secret), signed, hashlib.sha256).digest())
    for candidate in signatures.split():
        version, _, value = candidate.partition(",")
        if version == "v1" and hmac.compare_digest(value.encode(), expected):
            break
    else:
        raise WebhookVerificationError(
            "no signature matches this secret: the body was changed, or the secret is not "
            "this account's (after a rotation, use the new one)"
        )
    try:
        event: dict[str, Any] = json.loads(raw)
    except ValueError:
        raise WebhookVerificationError("the signed body is not JSON") from None
    return event
