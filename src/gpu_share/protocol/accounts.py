"""Tenants, keys and applications (SPEC §1.1)."""

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field

from gpu_share.protocol.common import Email


class Role(StrEnum):
    TENANT = "tenant"
    PROVIDER = "provider"
    AGENT = "agent"
    ADMIN = "admin"


class KeyInfo(BaseModel):
    id: str
    role: Role
    prefix: str = Field(description="The first characters of the key, enough to recognise it")
    tenant_id: str | None = None
    created_at: datetime
    revoked_at: datetime | None = None


class IssuedKey(KeyInfo):
    api_key: str = Field(description="Shown once; only its hash is stored")


class TenantCreate(BaseModel):
    name: str = Field(min_length=1, max_length=200)
    email: Email


class Tenant(BaseModel):
    id: str
    name: str
    email: str
    created_at: datetime
    keys: list[KeyInfo] = []


class TenantWithKey(BaseModel):
    id: str
    name: str
    email: str
    key_id: str
    api_key: str = Field(description="Shown once; only its hash is stored")


class ApplicationStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"


class TenantApplicationCreate(BaseModel):
    name: str = Field(min_length=1, max_length=200)
    email: Email
    company: str | None = Field(default=None, max_length=200)
    intended_use: str = Field(min_length=1, max_length=4000)


class TenantApplication(BaseModel):
    id: str
    name: str
    email: str
    company: str | None
    intended_use: str
    status: ApplicationStatus
    reason: str | None = None
    tenant_id: str | None = None
    created_at: datetime
    decided_at: datetime | None = None


class Rejection(BaseModel):
    reason: str = Field(min_length=1, max_length=2000)
