"""The provider's dashboard: their machines with live status and telemetry, and the tabs
beside them: benchmarks, pricing, earnings, payouts, and performance with each machine's
availability schedule."""
