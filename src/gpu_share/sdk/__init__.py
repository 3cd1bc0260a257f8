"""The tenant SDK (httpx)."""
