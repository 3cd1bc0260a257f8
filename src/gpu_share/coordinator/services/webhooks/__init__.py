"""Signed webhooks (Standard Webhooks): each account's signing secret (`signing_keys`), its
endpoints (`endpoints`), the events other domains emit in the transaction of the change
that causes them (`events`, an outbox), and their delivery with retries and a log the
account reads and replays (`deliveries`, `sender`). Owns `webhook_secrets`,
`webhook_endpoints`, `webhook_deliveries`, `webhook_attempts`."""

__all__ = ["events"]
