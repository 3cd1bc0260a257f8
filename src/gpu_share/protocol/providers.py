"""Providers as admins create them (the full application flow is SPEC §3.1)."""

from datetime import datetime

from pydantic import BaseModel, Field

from gpu_share.protocol.common import Email
from gpu_share.protocol.nodes import Tier


class ProviderCreate(BaseModel):
    name: str = Field(min_length=1, max_length=200)
    email: Email
    tier: Tier = Tier.COMMUNITY


class Provider(BaseModel):
    id: str
    name: str
    email: str
    tier: Tier
    created_at: datetime


class ProviderWithCredentials(Provider):
    api_key: str = Field(description="gpu_pk_…; shown once")
    enrollment_token: str = Field(description="gpu_et_…; give it to `gpu-share agent --token`")
