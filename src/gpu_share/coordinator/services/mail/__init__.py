"""Mail that is never lost: the outbox written in the transaction of the decision that
causes it (`outbox`), the words of the platform's mails (`mails`), and delivery over SMTP
(`delivery`). Owns `outbox_mails`."""

__all__ = ["mails", "outbox"]
