"""The people and the record behind the machines (SPEC §3.1, §3.3, §3.7, §3.8): provider
applications and their review (`provider_applications`), providers (`providers`), the
enrollment tokens their agents register with (`enrollment_tokens`), registering a machine
as the node its hardware already is, or a new one starting at its provider's score
(`enrollment`), benchmark runs and the scores that list or delist a GPU (`benchmarks`), and
the reliability score (`reliability`, its formula in `reliability_formula`, whose
`PROVIDER_SIDE` says which failures are the provider's), and what their application
declared against what their machines proved (`declared_hardware`). Owns `provider_applications`,
`providers`, `enrollment_tokens`, `benchmark_runs`, and the published scores on nodes and
providers."""

__all__ = ["reliability_formula"]
