"""Ids in paths: each has the shape `new_id` gives it, so anything else is a 422 at the door.

A well-formed id that names nothing (or another tenant's object) is still a 404.
"""

from typing import Annotated

from fastapi import Path

from gpu_share.coordinator.core.ids import id_pattern


def _id(prefix: str, what: str) -> object:
    return Path(pattern=id_pattern(prefix), description=f"The {what}'s id ({prefix}_…)")


InvokeId = Annotated[str, _id("inv", "invoke")]
SessionId = Annotated[str, _id("ses", "session")]
ArtifactId = Annotated[str, _id("art", "artifact")]
TenantId = Annotated[str, _id("ten", "tenant")]
KeyId = Annotated[str, _id("key", "key")]
TenantApplicationId = Annotated[str, _id("tapp", "tenant application")]
NodeId = Annotated[str, _id("nod", "node")]
ChallengeId = Annotated[str, _id("chl", "challenge")]
IncidentId = Annotated[str, _id("inc", "trust incident")]
