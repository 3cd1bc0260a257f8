"""The tenant's API (Bearer gpu_sk_…, SPEC §1): invokes, sessions, artifacts, billing,
reservations, and discovery (nodes, runtimes, offers)."""
