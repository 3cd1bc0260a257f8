"""Provider dashboard pages: performance."""

from fastapi import APIRouter

router = APIRouter(prefix="/provider", include_in_schema=False)
