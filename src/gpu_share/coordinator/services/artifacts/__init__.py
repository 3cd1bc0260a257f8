"""Hosted artifacts (SPEC §1.3): streamed uploads with hashing and quota, content-addressed
blobs, signed download links, expiry. Owns `artifacts`, `blobs`."""

__all__ = ["artifacts"]
