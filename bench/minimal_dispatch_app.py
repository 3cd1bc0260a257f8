"""The baseline for bench/dispatch.py (a): a minimal Starlette + asyncpg app doing the claim.

What a lean job queue over HTTP costs, with none of our rules: a tenant submits a job
(`POST /v1/gpu/invoke`, a JSON body, 202), an agent leases one (`POST /v1/agent/lease`:
one `UPDATE … WHERE id = (SELECT … FOR UPDATE SKIP LOCKED)` statement that picks, locks
and assigns, the oldest first) and reports its result (`POST /v1/agent/invokes/{id}/result`:
one guarded `UPDATE`, checked against the lease token; `"next": true` leases the next job
in the same request, as ours does). Callers show a bearer key, checked against a dict
(ours checks a hashed key against a cache). No placement, prices, fair share, trust,
billing or logs.

Run as `uvicorn bench.minimal_dispatch_app:app` with `BENCH_DSN` (a PostgreSQL URL) and
`BENCH_KEY` (the one key every caller shows) in the environment.
"""

import json
import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

SCHEMA = """
CREATE TABLE IF NOT EXISTS minimal_jobs (
    id bigserial PRIMARY KEY,
    status text NOT NULL,
    body jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    node text,
    lease_token text,
    result jsonb
);
CREATE INDEX IF NOT EXISTS minimal_jobs_queued ON minimal_jobs (created_at)
    WHERE status = 'queued';
"""

CLAIM = """
UPDATE minimal_jobs SET status = 'running', node = $1, lease_token = $2
WHERE id = (
    SELECT id FROM minimal_jobs WHERE status = 'queued'
    ORDER BY created_at FOR UPDATE SKIP LOCKED LIMIT 1
)
RETURNING id, body
"""

FINISH = """
UPDATE minimal_jobs SET status = 'done', result = $3
WHERE id = $1 AND lease_token = $2 AND status = 'running'
"""

pool: asyncpg.Pool | None = None
KEY = os.environ.get("BENCH_KEY", "")


@asynccontextmanager
async def lifespan(_: Starlette) -> AsyncIterator[None]:
    global pool
    pool = await asyncpg.create_pool(os.environ["BENCH_DSN"], min_size=2, max_size=10)
    async with pool.acquire() as conn:
        await conn.execute(SCHEMA)
    yield
    await pool.close()


def authorized(request: Request) -> bool:
    return request.headers.get("authorization") == f"Bearer {KEY}"


async def claim(conn: asyncpg.Connection, node: str) -> list[dict[str, Any]]:
    token = secrets.token_hex(16)
    row = await conn.fetchrow(CLAIM, node, token)
    if row is None:
        return []
    return [{"invoke_id": row["id"], "lease_token": token, "spec": json.loads(row["body"])}]


async def submit(request: Request) -> Response:
    if not authorized(request):
        return JSONResponse({"error": "unauthorized"}, status_code=401)
    body = await request.json()
    if not isinstance(body, dict) or "runtime" not in body:
        return JSONResponse({"error": "runtime is required"}, status_code=422)
    assert pool is not None
    job_id = await pool.fetchval(
        "INSERT INTO minimal_jobs (status, body) VALUES ('queued', $1) RETURNING id",
        json.dumps(body),
    )
    return JSONResponse({"id": job_id, "status": "queued"}, status_code=202)


async def lease(request: Request) -> Response:
    if not authorized(request):
        return JSONResponse({"error": "unauthorized"}, status_code=401)
    body = await request.json()
    assert pool is not None
    async with pool.acquire() as conn:
        jobs = await claim(conn, str(body.get("node", "")))
    return JSONResponse({"jobs": jobs})


async def result(request: Request) -> Response:
    if not authorized(request):
        return JSONResponse({"error": "unauthorized"}, status_code=401)
    body = await request.json()
    assert pool is not None
    async with pool.acquire() as conn:
        done = await conn.execute(
            FINISH,
            int(request.path_params["job_id"]),
            str(body.get("lease_token", "")),
            json.dumps(body.get("result")),
        )
        if done != "UPDATE 1":
            return JSONResponse({"error": "stale lease"}, status_code=409)
        jobs = await claim(conn, str(body.get("node", ""))) if body.get("next") else []
    return JSONResponse({"jobs": jobs})


async def health(_: Request) -> Response:
    return Response("ok")


app = Starlette(
    routes=[
        Route("/v1/gpu/invoke", submit, methods=["POST"]),
        Route("/v1/agent/lease", lease, methods=["POST"]),
        Route("/v1/agent/invokes/{job_id:int}/result", result, methods=["POST"]),
        Route("/health", health),
    ],
    lifespan=lifespan,
)
