"""Our signatures are the reference implementation's (Standard Webhooks)."""

from datetime import UTC, datetime

from standardwebhooks.webhooks import Webhook

from gpu_share.coordinator.services.webhooks import signing


def test_a_signature_is_the_one_the_reference_implementation_makes() -> None:
    secret = signing.new_secret()
    body = '{"type":"invoke.done","data":{"id":"inv_1","text":"é ✓"}}'
    stamp = 1_796_000_000
    ours = signing.signature(secret, "msg_1", stamp, body)
    assert ours == Webhook(secret).sign("msg_1", datetime.fromtimestamp(stamp, tz=UTC), body)


def test_headers_carry_one_signature_per_secret_in_force() -> None:
    old, new = signing.new_secret(), signing.new_secret()
    headers = signing.headers([new, old], "msg_2", 1_796_000_000, "{}")
    assert headers["webhook-id"] == "msg_2" and headers["webhook-timestamp"] == "1796000000"
    first, second = headers["webhook-signature"].split(" ")
    assert first == signing.signature(new, "msg_2", 1_796_000_000, "{}")
    assert second == signing.signature(old, "msg_2", 1_796_000_000, "{}")


def test_every_secret_is_new_and_in_the_whsec_format() -> None:
    made = {signing.new_secret() for _ in range(50)}
    assert len(made) == 50
    assert all(s.startswith("whsec_") and len(s) == len("whsec_") + 44 for s in made)
