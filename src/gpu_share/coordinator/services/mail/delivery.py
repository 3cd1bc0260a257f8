"""Sends outbox mail over SMTP (aiosmtplib), one claimed batch at a time."""

import logging
from email.message import EmailMessage
from email.utils import formatdate, make_msgid

import aiosmtplib

from gpu_share.coordinator.core.clock import Clock
from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.settings import Settings, SmtpSecurity
from gpu_share.coordinator.services.mail import outbox

log = logging.getLogger(__name__)

SEND_TIMEOUT_SEC = 30.0


def message_of(mail: outbox.Claimed, sender: str) -> EmailMessage:
    message = EmailMessage()
    message["From"] = sender
    message["To"] = mail.to
    message["Subject"] = mail.subject
    message["Date"] = formatdate(localtime=False)
    # The same id on every attempt, so a receiver can drop a duplicate.
    message["Message-ID"] = make_msgid(idstring=mail.id, domain="gpu-share")
    message.set_content(mail.body)
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


async def deliver_due(db: Database, clock: Clock, settings: Settings) -> tuple[int, int]:
    """Send what is due; returns (sent, failed). A failure is retried later with backoff."""
    async with db.write() as session:
        batch = await outbox.claim_due(session, clock.now())
    sent = failed = 0
    for mail in batch:
        try:
            await send(settings, message_of(mail, settings.mail_from))
        except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
            failed += 1
            log.warning("mail %s to %s not sent (%s); will retry", mail.id, mail.to, exc)
            async with db.write() as session:
                await outbox.mark_failed(session, mail, str(exc), clock.now())
            continue
        sent += 1
        async with db.write() as session:
            await outbox.mark_sent(session, mail, clock.now())
    return sent, failed
