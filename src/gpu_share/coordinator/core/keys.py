"""API keys: random, prefixed by role, stored only as a SHA-256 hash.

Keys carry 256 bits of entropy, so a fast hash is the right one: there is nothing
to brute-force, and lookups stay one indexed equality.
"""

import hashlib
import secrets

from gpu_share.protocol.accounts import Role

KEY_PREFIXES: dict[Role, str] = {
    Role.TENANT: "gpu_sk_",
    Role.PROVIDER: "gpu_pk_",
    Role.AGENT: "gpu_ak_",
    Role.ADMIN: "gpu_admin_",
}
ENROLLMENT_PREFIX = "gpu_et_"
DISPLAY_CHARS = 6  # of the secret part, after the role prefix


def generate_secret() -> str:
    return secrets.token_urlsafe(32)


def generate_key(role: Role) -> str:
    return KEY_PREFIXES[role] + generate_secret()


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def display_prefix(key: str) -> str:
    for prefix in (*KEY_PREFIXES.values(), ENROLLMENT_PREFIX):
        if key.startswith(prefix):
            return key[: len(prefix) + DISPLAY_CHARS]
    return key[:DISPLAY_CHARS]


def role_of(key: str) -> Role | None:
    """The role a key's prefix claims; the database has the final word."""
    for role, prefix in KEY_PREFIXES.items():
        if key.startswith(prefix):
            return role
    return None
