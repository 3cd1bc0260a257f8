"""The coordinator: the HTTP API, the rules and the background loops."""
