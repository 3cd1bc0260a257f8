"""Who may call: tenants, their applications, API keys of every role and the admin key
(`accounts`), and the per-address rate limits that slow down key guessing
(`rate_limits`). Owns `tenants`, `tenant_applications`, `api_keys`, `rate_limits`."""

__all__ = ["accounts"]
