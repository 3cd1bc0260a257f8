"""Benchmarks: agents report runs and measure the network to the coordinator; admins ask
for a run; tenants and providers read the results."""

from fastapi import APIRouter

router = APIRouter(tags=["benchmarks"])
