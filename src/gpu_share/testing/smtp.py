"""A real SMTP server on loopback (aiosmtpd) that keeps what it receives, for tests.

`refuse_first=N` answers the first N messages `451 try again later`, as a busy relay
would, so a test can watch the outbox retry; `unknown` names recipients it answers
`550 no such user`, as a relay refuses an address for good. `recipients` keeps each
message's envelope recipients (a Bcc is only there).
"""

import email
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.message import Message
from typing import Any

from aiosmtpd.controller import Controller

from gpu_share.testing.servers import free_port


@dataclass
class MailCatcher:
    refuse_first: int = 0
    unknown: frozenset[str] = frozenset()
    received: list[Message] = field(default_factory=list)
    recipients: list[list[str]] = field(default_factory=list)
    refused: int = 0

    async def handle_RCPT(
        self, _server: Any, _session: Any, envelope: Any, address: str, _options: Any
    ) -> str:
        if address in self.unknown:
            return "550 5.1.1 No such user here"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, _server: Any, _session: Any, envelope: Any) -> str:
        if self.refused < self.refuse_first:
            self.refused += 1
            return "451 4.3.0 Try again later"
        self.received.append(email.message_from_bytes(envelope.content))
        self.recipients.append(list(envelope.rcpt_tos))
        return "250 OK"


@contextmanager
def smtp_server(
    refuse_first: int = 0, unknown: frozenset[str] = frozenset()
) -> Iterator[tuple[MailCatcher, int]]:
    catcher = MailCatcher(refuse_first=refuse_first, unknown=unknown)
    port = free_port()
    controller = Controller(catcher, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield catcher, port
    finally:
        controller.stop()
