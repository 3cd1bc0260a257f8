"""Who is calling: one typed principal per role, each with the ids its role always has.

A tenant key always belongs to a tenant and a node key to a node of a provider, so
routes receive `TenantCaller.tenant_id: str`, never an optional to assert on.
"""

from dataclasses import dataclass
from typing import ClassVar

from gpu_share.protocol.accounts import Role


@dataclass(frozen=True)
class Principal:
    """Any verified key: its id and role."""

    role: ClassVar[Role]
    key_id: str


@dataclass(frozen=True)
class TenantCaller(Principal):
    role: ClassVar[Role] = Role.TENANT
    tenant_id: str


@dataclass(frozen=True)
class ProviderCaller(Principal):
    role: ClassVar[Role] = Role.PROVIDER
    provider_id: str


@dataclass(frozen=True)
class NodeCaller(Principal):
    """An agent, speaking for one node of one provider."""

    role: ClassVar[Role] = Role.AGENT
    provider_id: str
    node_id: str


@dataclass(frozen=True)
class AdminCaller(Principal):
    role: ClassVar[Role] = Role.ADMIN


ROLE_NAMES = {
    Role.TENANT: "a tenant key (gpu_sk_…)",
    Role.PROVIDER: "a provider key (gpu_pk_…)",
    Role.AGENT: "an agent node key (gpu_ak_…)",
    Role.ADMIN: "an admin key (gpu_admin_…)",
}
