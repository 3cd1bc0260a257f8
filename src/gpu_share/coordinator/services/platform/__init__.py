"""The platform as a whole: its health (`health`) and what the admin's overview counts
across every domain (`overview`). Read-only."""

__all__: list[str] = []
