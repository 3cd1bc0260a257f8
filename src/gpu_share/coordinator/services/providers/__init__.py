"""The people and the record behind the machines (SPEC §3.1, §3.3, §3.7): provider
applications and their review (`provider_applications`), providers and enrollment tokens
(`providers`), benchmark runs and the scores that list or delist a GPU (`benchmarks`), and
the reliability score (`reliability`, its formula in `reliability_formula`, whose
`PROVIDER_SIDE` says which failures are the provider's). Owns `provider_applications`,
`providers`, `enrollment_tokens`, `benchmark_runs`, and the published scores on nodes and
providers."""

__all__ = ["reliability_formula"]
