"""The machines and what they offer (SPEC §3.2, §3.4, §4.1): registration, inventory and
telemetry (`nodes`), which node a machine is by its hardware (`hardware`), heartbeats
counted per bucket (`presence`), the weekly windows (`schedules`), the provider's rates
(`prices`), the GPU models the platform knows (`gpu_catalog`), which nodes may run which
job (`placement`, with the one rule of proven hardware; `shortfall` says in words why none
can take a request) and how they rank (`ranking`),
what is shown of a node's proven hardware (`proofs`), and which nodes are trusted to
re-run other nodes' jobs (`trusted`, with the spot-check record that rule reads).

Every domain that places or prices work reads its eligibility rules here, so this is the
lowest domain but for accounts. Owns `nodes`, `node_presence`, `telemetry_samples`,
`provider_prices`."""

__all__ = [
    "gpu_catalog",
    "hardware",
    "nodes",
    "placement",
    "presence",
    "prices",
    "proofs",
    "ranking",
    "schedules",
    "shortfall",
    "trusted",
]
