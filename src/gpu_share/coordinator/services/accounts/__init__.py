"""Who may call: tenants, API keys of every role and the admin key (`accounts`), tenants'
applications, confirmed by a link mailed to their email (`tenant_applications`), the
browsers signed in with those keys (`browser_sessions`), and the per-address rate
limits that slow down key guessing (`rate_limits`). Owns `tenants`,
`tenant_applications`, `api_keys`, `browser_sessions`, `rate_limits`."""

__all__ = ["accounts"]
