"""The tenant's console: an overview with a first-invoke example, artifacts, invokes
(start, follow, results, cancel), sessions, the nodes and runtimes on offer, the
marketplace, reservations, usage and billing, and API keys."""
