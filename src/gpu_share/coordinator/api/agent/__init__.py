"""The agent protocol (Bearer gpu_ak_…, `gpu_share.protocol.agent`): registration,
heartbeats, leases and results (`node`), the session channel (`sessions`), benchmark runs
(`benchmarks`), hardware challenges (`challenges`)."""
