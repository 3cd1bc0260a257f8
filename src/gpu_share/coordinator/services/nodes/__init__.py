"""The machines and what they offer (SPEC §3.2, §3.4, §4.1): registration, inventory and
telemetry (`nodes`), heartbeats counted per bucket (`presence`), the weekly windows
(`schedules`), the provider's rates (`prices`), the GPU models the platform knows
(`gpu_catalog`), which nodes may run which job (`placement`) and how they rank (`ranking`).

Every domain that places or prices work reads its eligibility rules here, so this is the
lowest domain but for accounts. Owns `nodes`, `node_presence`, `telemetry_samples`,
`provider_prices`."""

__all__ = ["gpu_catalog", "nodes", "placement", "presence", "prices", "ranking", "schedules"]
