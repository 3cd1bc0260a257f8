"""Clocks for tests: re-exported so tests import from one place."""

from gpu_share.coordinator.core.clock import FrozenClock, SystemClock

__all__ = ["FrozenClock", "SystemClock"]
