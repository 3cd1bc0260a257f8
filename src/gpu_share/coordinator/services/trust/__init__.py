"""Trust: what the platform has checked of a node (docs/trust.md).

The hardware `challenges`: seeded, timed work sized to what a GPU (or a CPU node's
cores) claims to be, and what passing them proves (`NodeRow.verification`, written
through `verification`), and where each claim stands with them for the pages
(`challenge_status`).

The spot checks of results: which ended jobs are run again on a trusted node
(`spot_checks`, at the rate `spot_check_rates` keeps per node and runtime), how the
results are compared (`comparison` for arrays, `training_comparison` for CatBoost,
`failure_comparison` for failures; pure), concluding a check (`check_verdicts`, reading
outputs through `check_outputs`), what a caught node costs and whom (`consequences`,
mailing through `incident_mails`), and the incidents as admins and providers read
them with the admin's mark of trusted nodes (`incidents`).

Owns `challenges`, `trust_incidents`, the trust columns of `nodes` (`verification`,
`next_challenge_at`, `spot_checks`, `trusted`, `quarantined_at`, `quarantine_reason`),
of `providers` (`offences`, `suspended_at`) and of `invokes` (`check_state`,
`refunded_at`, `refund_reason`), and the check invokes it queues (`check_of`); their
statuses are `work`'s (`invoke_state`). Uses `work` (invokes, their states), `money`
(refunds and forfeits), `mail` (the outbox), `artifacts` (outputs stored there) and
`nodes` (the GPU catalog, placement, who is trusted).
"""

__all__ = ["challenges"]
