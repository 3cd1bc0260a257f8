"""`verify_webhook`: what the reference implementation of Standard Webhooks signs, it
accepts; anything else it refuses, saying why."""

import time
from datetime import UTC, datetime

import pytest
from standardwebhooks.webhooks import Webhook

from gpu_share.sdk import WebhookVerificationError, verify_webhook

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
NOW = 1_796_000_000  # a fixed "now" (unix seconds) for the refusals
BODY = b'{"type":"invoke.done","timestamp":"2026-12-04T16:00:00+00:00","data":{"id":"inv_1"}}'


def signed(body: bytes = BODY, *, secret: str = SECRET, at: float | None = None) -> dict[str, str]:
    stamp = datetime.fromtimestamp(int(at or time.time()), tz=UTC)
    return {
        "Webhook-Id": "msg_1",
        "Webhook-Timestamp": str(int(stamp.timestamp())),
        "Webhook-Signature": Webhook(secret).sign("msg_1", stamp, body),
    }


def test_a_delivery_signed_as_the_reference_signs_is_accepted_and_parsed() -> None:
    event = verify_webhook(SECRET, signed(), BODY)
    assert event["type"] == "invoke.done" and event["data"] == {"id": "inv_1"}
    assert verify_webhook(SECRET, signed(), BODY.decode()) == event  # str bodies too


def test_one_matching_signature_among_several_is_enough() -> None:
    other = "whsec_" + "A" * 43 + "="
    headers = signed(secret=other)
    headers["Webhook-Signature"] += " " + signed()["Webhook-Signature"]
    assert verify_webhook(SECRET, headers, BODY)["type"] == "invoke.done"
    assert verify_webhook(other, headers, BODY)["type"] == "invoke.done"


@pytest.mark.parametrize(
    ("headers", "body", "words"),
    [
        (signed(at=NOW), BODY.replace(b"inv_1", b"inv_2"), "no signature matches"),
        (signed(secret="whsec_" + "B" * 43 + "=", at=NOW), BODY, "no signature matches"),
        (signed(at=NOW - 600), BODY, "too old"),
        (signed(at=NOW + 600), BODY, "too new"),
        ({k: v for k, v in signed(at=NOW).items() if k != "Webhook-Id"}, BODY, "webhook-id"),
        ({**signed(at=NOW), "Webhook-Timestamp": "yesterday"}, BODY, "not unix seconds"),
        ({**signed(at=NOW), "Webhook-Signature": "v2,abc"}, BODY, "no signature matches"),
    ],
)
def test_anything_else_is_refused_saying_why(
    headers: dict[str, str], body: bytes, words: str
) -> None:
    # Signed at a fixed moment and checked at it: the cases are built at collection,
    # which may be many minutes before the test runs.
    with pytest.raises(WebhookVerificationError) as refused:
        verify_webhook(SECRET, headers, body, now=NOW)
    assert words in refused.value.message


def test_the_tolerance_and_the_clock_can_be_given() -> None:
    headers = signed(at=1_796_000_000)
    assert verify_webhook(SECRET, headers, BODY, now=1_796_000_100)["type"] == "invoke.done"
    with pytest.raises(WebhookVerificationError):
        verify_webhook(SECRET, headers, BODY, now=1_796_000_100, tolerance=30)


def test_a_secret_that_is_not_whsec_base64_is_refused_clearly() -> None:
    with pytest.raises(WebhookVerificationError, match="not a whsec_"):
        verify_webhook("whsec_not base64!", signed(), BODY)
