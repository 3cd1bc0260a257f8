"""Helpers for tests and benchmarks: databases, factories, a frozen clock, processes."""
