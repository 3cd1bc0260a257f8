"""Availability schedules and the published reliability score."""

from fastapi import APIRouter

router = APIRouter(tags=["reliability"])
