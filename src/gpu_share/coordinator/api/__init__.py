"""Thin JSON routers by audience: parse, authorize through a dependency (`auth`), call one
service, return. `public/` needs no key; `tenant/`, `provider/` and `admin/` take their
role's key; `agent/` is the protocol agents speak with a node key. `auth`, `deps`,
`paths`, `responses`, `limits`, `docs` and `webhooks` (the routes tenants and providers
both have) are what the routers share."""
