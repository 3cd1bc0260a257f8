"""Closes idle sessions, flushes their metering, fails sessions no replica holds."""

from gpu_share.coordinator.runtime import Runtime
from gpu_share.coordinator.services import sessions


async def run_once(runtime: Runtime) -> None:
    await sessions.maintain(runtime)
