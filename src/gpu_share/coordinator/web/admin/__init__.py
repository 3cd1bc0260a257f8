"""The admin's pages (SPEC §5, §3.1): the overview and mail outbox, provider applications
and their review, tenants with their applications, top-ups and keys, providers and nodes,
and payout batches.

Each page calls the same service as the admin API. An action that makes a secret (a
claim link, a tenant's first key, another key) answers with the page itself, the secret
shown this once: a secret never rides in a redirect or a cookie. Every other action
redirects with a flash, and a refused one shows the page again with the service's words
next to the field they are about.
"""
