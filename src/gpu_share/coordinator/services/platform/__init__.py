"""The platform as a whole: its health (`health`), what the admin's overview counts
across every domain (`overview`) and what /metrics reads from the database (`metrics`).
Read-only."""

__all__: list[str] = []
