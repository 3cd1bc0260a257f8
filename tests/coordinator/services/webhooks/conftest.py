"""Webhook tests send to a real receiver on loopback, which the SSRF-safe fetcher refuses
unless the operator allows it: these tests allow 127.0.0.1, as an operator may."""

from collections.abc import AsyncIterator

import pytest

from gpu_share.coordinator.core.settings import Settings
from gpu_share.testing.webhook_receiver import Receiver, webhook_receiver


@pytest.fixture
def settings(settings: Settings) -> Settings:
    settings.url_allow_networks = ["127.0.0.1/32"]
    settings.webhook_timeout_sec = 0.3  # an unanswered attempt gives up quickly
    return settings


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    async with webhook_receiver() as running:
        yield running
