"""Sends outbox mail over SMTP (aiosmtplib), one claimed batch at a time.

A failure is one of two kinds. For now (the server is away, busy, answers 4xx, or
refuses our login): the mail is tried again with backoff, and failed only after
`outbox.GIVE_UP_AFTER`. For good (the mail cannot be built, or the server answers 5xx
about this recipient or this message): it is failed at once with the reason, and never
tried again. Either way the batch goes on with the next mail.
"""

import email.errors
import logging
from email.message import EmailMessage
from email.utils import formatdate, make_msgid

import aiosmtplib

from gpu_share.coordinator.core.clock import Clock
from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.settings import Settings, SmtpSecurity
from gpu_share.coordinator.services.mail import outbox
from gpu_share.coordinator.services.mail.headers import header_text, recipient_problem

log = logging.getLogger(__name__)

SEND_TIMEOUT_SEC = 30.0


class Unbuildable(Exception):
    """This mail can never be sent as stored (its recipient, a header)."""


def message_of(mail: outbox.Claimed, sender: str) -> EmailMessage:
    if problem := recipient_problem(mail.to):
        raise Unbuildable(problem)
    message = EmailMessage()
    try:
        message["From"] = sender
        message["To"] = mail.to
        # Cleaned again: a mail queued before subjects were cleaned is sent, not failed.
        message["Subject"] = header_text(mail.subject)
        message["Date"] = formatdate(localtime=False)
        # The same id on every attempt, so a receiver can drop a duplicate.
        message["Message-ID"] = make_msgid(idstring=mail.id, domain="gpu-share")
        message.set_content(mail.body)
    except (ValueError, TypeError, email.errors.MessageError) as exc:
        raise Unbuildable(f"the mail cannot be built: {exc}") from exc
    return message


async def send(settings: Settings, message: EmailMessage) -> None:
    password = settings.smtp_password.get_secret_value() if settings.smtp_password else None
    await aiosmtplib.send(
        message,
        hostname=settings.smtp_host,
        port=settings.smtp_port,
        username=settings.smtp_username or None,
        password=password,
        use_tls=settings.smtp_security is SmtpSecurity.TLS,
        start_tls=settings.smtp_security is SmtpSecurity.STARTTLS,
        timeout=SEND_TIMEOUT_SEC,
    )


def for_good(exc: Exception) -> bool:
    """Whether sending this mail again cannot succeed. Refusals of the sender or of our
    login are the server's setup, not the mail's: they are retried like an outage."""
    match exc:
        case Unbuildable() | aiosmtplib.SMTPNotSupported():
            return True
        case aiosmtplib.SMTPRecipientsRefused():
            return all(r.code >= 500 for r in exc.recipients)
        case aiosmtplib.SMTPRecipientRefused() | aiosmtplib.SMTPDataError():
            return exc.code >= 500
        case aiosmtplib.SMTPException() | OSError() | TimeoutError():
            return False
    return True  # anything else comes from this mail (an address aiosmtplib cannot encode)


async def deliver_due(db: Database, clock: Clock, settings: Settings) -> tuple[int, int]:
    """Send what is due; returns (sent, failed). A failure is retried or given up (above)."""
    async with db.write() as session:
        batch = await outbox.claim_due(session, clock.now())
    sent = failed = 0
    for mail in batch:
        try:
            await send(settings, message_of(mail, settings.mail_from))
        except Exception as exc:  # one mail's failure must not stop the others
            failed += 1
            async with db.write() as session:
                given_up = await outbox.mark_failed(
                    session,
                    mail,
                    str(exc) or type(exc).__name__,
                    clock.now(),
                    for_good=for_good(exc),
                )
            log.warning(
                "mail %s to %r not sent (%s); %s",
                mail.id,
                mail.to,
                exc,
                "given up" if given_up else "will retry",
            )
            continue
        sent += 1
        async with db.write() as session:
            await outbox.mark_sent(session, mail, clock.now())
    return sent, failed
