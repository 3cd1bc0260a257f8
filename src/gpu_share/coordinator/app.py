"""`create_app(settings)`: the coordinator's FastAPI application.

Every error leaves through the handlers below: in the one JSON shape of SPEC §1.8, or,
to a person's browser on a page's address, as an error page with the same status and
headers (`http/negotiation.py`, `web/error_pages.py`).
"""

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import DataError, IntegrityError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from gpu_share._version import API_VERSION
from gpu_share.coordinator import migrate
from gpu_share.coordinator.api import docs
from gpu_share.coordinator.api.admin import accounts as admin_accounts
from gpu_share.coordinator.api.admin import bank_payouts as admin_bank_payouts
from gpu_share.coordinator.api.admin import billing as admin_billing
from gpu_share.coordinator.api.admin import chain_payouts as admin_chain_payouts
from gpu_share.coordinator.api.admin import challenges as admin_challenges
from gpu_share.coordinator.api.admin import enrollment as admin_enrollment
from gpu_share.coordinator.api.admin import metrics as admin_metrics
from gpu_share.coordinator.api.admin import payouts as admin_payouts
from gpu_share.coordinator.api.admin import providers as admin_providers
from gpu_share.coordinator.api.admin import trust as admin_trust
from gpu_share.coordinator.api.agent import benchmarks as agent_benchmarks
from gpu_share.coordinator.api.agent import challenges as agent_challenges
from gpu_share.coordinator.api.agent import node as agent_node
from gpu_share.coordinator.api.agent import sessions as agent_sessions
from gpu_share.coordinator.api.limits import RequestLimitMiddleware, limits_of
from gpu_share.coordinator.api.provider import account as provider_account
from gpu_share.coordinator.api.provider import challenges as provider_challenges
from gpu_share.coordinator.api.provider import enrollment as provider_enrollment
from gpu_share.coordinator.api.provider import payouts as provider_payouts
from gpu_share.coordinator.api.provider import prices as provider_prices
from gpu_share.coordinator.api.provider import reliability as provider_reliability
from gpu_share.coordinator.api.provider import statements as provider_statements
from gpu_share.coordinator.api.provider import trust as provider_trust
from gpu_share.coordinator.api.provider import webhooks as provider_webhooks
from gpu_share.coordinator.api.public import (
    health,
    install,
    provider_applications,
    tenant_applications,
)
from gpu_share.coordinator.api.relay import relay_handler
from gpu_share.coordinator.api.tenant import (
    artifacts,
    invokes,
    nodes,
    offers,
    reservations,
    sessions,
)
from gpu_share.coordinator.api.tenant import billing as tenant_billing
from gpu_share.coordinator.api.tenant import deposits as tenant_deposits
from gpu_share.coordinator.api.tenant import spending_limits as tenant_spending_limits
from gpu_share.coordinator.api.tenant import statements as tenant_statements
from gpu_share.coordinator.api.tenant import webhooks as tenant_webhooks
from gpu_share.coordinator.core.clock import Clock, SystemClock
from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.errors import ApiError
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.core.signing import load_signer
from gpu_share.coordinator.http.negotiation import wants_page
from gpu_share.coordinator.http.peer_client import LinkPeers
from gpu_share.coordinator.http.relay_listener import RelayListener
from gpu_share.coordinator.http.request_context import RequestContextMiddleware
from gpu_share.coordinator.http.route_index import index_routes
from gpu_share.coordinator.http.routes import add_routes
from gpu_share.coordinator.http.security_headers import (
    SecurityHeadersMiddleware,
    with_security_headers,
)
from gpu_share.coordinator.loops import (
    artifact_sweep,
    challenges,
    housekeeping,
    lease_expiry,
    mail_delivery,
    replica_beat,
    session_upkeep,
    webhook_delivery,
)
from gpu_share.coordinator.loops import chain_payouts as loops_chain_payouts
from gpu_share.coordinator.loops import deposits as loops_deposits
from gpu_share.coordinator.loops import earnings_hold as loops_holds
from gpu_share.coordinator.loops import payouts as loops_payouts
from gpu_share.coordinator.loops import preemption as loops_preemption
from gpu_share.coordinator.loops import reliability as loops_reliability
from gpu_share.coordinator.loops import reservations as loops_reservations
from gpu_share.coordinator.loops import spot_checks as loops_spot_checks
from gpu_share.coordinator.loops.runner import LoopRunner, PeriodicJob
from gpu_share.coordinator.replica.key_cache import KeyCache
from gpu_share.coordinator.replica.notify import notifier_for
from gpu_share.coordinator.replica.session_hub import SessionHub
from gpu_share.coordinator.replica.session_routes import ROUTE_TTL_SEC, SessionRoutes
from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.accounts.accounts import ensure_admin_key
from gpu_share.coordinator.services.sessions import channels
from gpu_share.coordinator.services.sessions.sessions import Sessions
from gpu_share.coordinator.storage import ArtifactStore, open_store
from gpu_share.coordinator.web import error_pages, site
from gpu_share.netguard import SafeFetcher, UrlPolicy
from gpu_share.protocol.errors import ErrorCode

log = logging.getLogger("gpu_share.coordinator")

_STATUS_CODES = {
    400: ErrorCode.VALIDATION_ERROR,
    401: ErrorCode.UNAUTHORIZED,
    403: ErrorCode.FORBIDDEN,
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.METHOD_NOT_ALLOWED,
    409: ErrorCode.CONFLICT,
    413: ErrorCode.PAYLOAD_TOO_LARGE,
    415: ErrorCode.UNSUPPORTED_MEDIA_TYPE,
    422: ErrorCode.VALIDATION_ERROR,
    429: ErrorCode.RATE_LIMITED,
    503: ErrorCode.UNAVAILABLE,
}


def error_response(
    status: int,
    code: str,
    message: str,
    details: Any = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body = {"error": {"code": code, "message": message, "details": details}}
    return JSONResponse(body, status_code=status, headers=headers)


async def answer(
    request: Request,
    status: int,
    code: str,
    message: str,
    details: Any = None,
    headers: Mapping[str, str] | None = None,
    *,
    for_people: bool = True,
    reference: str | None = None,
) -> Response:
    """The error as its client takes it: a page for a person's browser (showing `message`
    when it is `for_people`), else the JSON error."""
    if wants_page(request):
        try:
            return await error_pages.render(
                request,
                status,
                detail=message if for_people else None,
                headers=headers,
                reference=reference,
            )
        except Exception:
            log.exception("the error page failed; answering %s as JSON", status)
    return error_response(status, code, message, details, headers)


def _validation_details(exc: RequestValidationError) -> list[dict[str, Any]]:
    details = []
    for err in exc.errors():
        loc = [str(part) for part in err.get("loc", ())]
        details.append({"loc": loc, "msg": err.get("msg", ""), "type": err.get("type", "")})
    return details


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> Response:
        return await answer(request, exc.status, exc.code, exc.message, exc.details, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        details = _validation_details(exc)
        summary = "; ".join(
            f"{'.'.join(d['loc'][1:] or d['loc'])}: {d['msg']}" for d in details[:5]
        )
        return await answer(
            request, 422, ErrorCode.VALIDATION_ERROR, summary or "invalid request", details
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        code = _STATUS_CODES.get(exc.status_code, ErrorCode.VALIDATION_ERROR)
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            return await answer(
                request, 404, code, "no such endpoint; see /docs for the API", for_people=False
            )
        if exc.status_code == 400 and message.startswith("There was an error parsing the body"):
            # FastAPI's answer to a body it cannot decode: a validation error (§1.8), 422.
            unread = [{"loc": ["body"], "msg": "not UTF-8 JSON", "type": "json_invalid"}]
            return error_response(
                422, code, "the body could not be read; send UTF-8 JSON as the schema says", unread
            )
        # Starlette's own words ("Method Not Allowed") say no more than the page's title.
        return await answer(
            request, exc.status_code, code, message, headers=exc.headers, for_people=False
        )

    @app.exception_handler(IntegrityError)
    async def _integrity(request: Request, exc: IntegrityError) -> Response:
        log.info("integrity error answered as 409: %s", exc.orig)
        return await answer(
            request, 409, ErrorCode.CONFLICT, "conflicts with the current state; retry"
        )

    @app.exception_handler(DataError)
    async def _data(request: Request, exc: DataError) -> Response:
        # Input validation should have refused it; the database is the last line.
        log.warning("database refused a value: %s", exc.orig)
        return await answer(
            request,
            422,
            ErrorCode.VALIDATION_ERROR,
            "a value is out of range or not storable; fix the input",
        )

    @app.exception_handler(OperationalError)
    async def _operational(request: Request, exc: OperationalError) -> Response:
        log.warning("database unavailable: %s", exc.orig)
        return await answer(
            request,
            503,
            ErrorCode.UNAVAILABLE,
            "the database is busy or unreachable; retry shortly",
            headers={"Retry-After": "1"},
            for_people=False,
        )

    @app.exception_handler(PoolTimeout)
    async def _saturated(request: Request, exc: PoolTimeout) -> Response:
        # Every database connection of this process stayed busy for the pool's timeout:
        # overload, which a client rides out by retrying, not a fault in the request.
        log.warning("no database connection free: %s", exc)
        return await answer(
            request,
            503,
            ErrorCode.UNAVAILABLE,
            "the coordinator is overloaded; retry shortly",
            headers={"Retry-After": "2"},
            for_people=False,
        )

    @app.exception_handler(ClientDisconnect)
    async def _disconnect(_request: Request, _exc: ClientDisconnect) -> Response:
        return Response(status_code=400)  # nobody is listening any more

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        reference = secrets.token_hex(6)  # on the page, so a user can point at the log line
        log.exception("unhandled error (reference %s)", reference, exc_info=exc)
        response = await answer(
            request,
            500,
            ErrorCode.INTERNAL,
            "internal error; it has been logged",
            for_people=False,
            reference=reference,
        )
        # This handler answers from outside every middleware (Starlette's
        # ServerErrorMiddleware), the security headers' included: add them here.
        response.raw_headers = with_security_headers(response.raw_headers)
        return response


async def _start_relay(replica: Replica) -> RelayListener | None:
    """With `relay_host`, sessions held here answer peers, and peers' sessions are reached."""
    settings = replica.settings
    if not settings.relay_host:
        return None
    listener = RelayListener(
        relay_handler(replica),
        replica.signer,
        settings.relay_host,
        settings.relay_port,
        settings.relay_advertise_host,
        max_body=settings.websocket_max_bytes,
    )
    await listener.start()
    replica.relay_url = listener.url
    replica.peers = LinkPeers(replica.signer, max_body=settings.websocket_max_bytes)
    replica.routes = SessionRoutes(replica.clock, ROUTE_TTL_SEC)
    return listener


async def _stop_relay(replica: Replica, listener: RelayListener | None) -> None:
    """This process's channels are forgotten, so peers stop sending here, then it stops."""
    try:
        async with replica.db.write() as session:
            await channels.leave(session, replica.id)
    except Exception:  # its records go stale instead, and a peer's beat removes them
        log.warning("could not remove this process's records on stopping", exc_info=True)
    if listener is not None:
        await listener.stop()
    if isinstance(replica.peers, LinkPeers):
        await replica.peers.aclose()


def default_jobs(settings: Settings) -> list[PeriodicJob]:
    return [
        PeriodicJob(
            "artifact-sweep", settings.artifact_sweep_interval_sec, artifact_sweep.run_once
        ),
        # No heartbeat could arrive while this process was down: give agents one lease
        # length to reconnect before their leases count as lost.
        PeriodicJob(
            "lease-expiry",
            settings.lease_sweep_interval_sec,
            lease_expiry.run_once,
            start_after_sec=settings.lease_ttl_sec,
        ),
        PeriodicJob("session-upkeep", settings.session_sweep_interval_sec, session_upkeep.run_once),
        PeriodicJob("replica-beat", channels.BEAT_SEC, replica_beat.run_once),
        # Spot work gives way to waiting on-demand work (docs/placement.md, "Spot").
        PeriodicJob("preemption", settings.lease_sweep_interval_sec, loops_preemption.run_once),
        PeriodicJob("housekeeping", HOUSEKEEPING_SEC, housekeeping.run_once),
        PeriodicJob("mail-delivery", settings.mail_interval_sec, mail_delivery.run_once),
        PeriodicJob("reliability", settings.reliability_interval_sec, loops_reliability.run_once),
        PeriodicJob("payouts", settings.payout_interval_sec, loops_payouts.run_once),
        PeriodicJob("earnings-hold", settings.earnings_release_interval_sec, loops_holds.run_once),
        PeriodicJob("reservations", RESERVATIONS_SEC, loops_reservations.run_once),
        PeriodicJob("challenges", settings.challenge_interval_sec, challenges.run_once),
        PeriodicJob("spot-checks", settings.spot_check_interval_sec, loops_spot_checks.run_once),
        PeriodicJob("webhook-delivery", settings.webhook_interval_sec, webhook_delivery.run_once),
        PeriodicJob("chain-payouts", settings.solana_interval_sec, loops_chain_payouts.run_once),
        PeriodicJob("deposits", settings.solana_deposit_interval_sec, loops_deposits.run_once),
    ]


HOUSEKEEPING_SEC = 300.0
RESERVATIONS_SEC = 15.0  # placement holds reserved GPUs on time; this keeps status and books


def create_app(
    settings: Settings,
    *,
    clock: Clock | None = None,
    store: ArtifactStore | None = None,
    on_admin_key: Callable[[str], None] | None = None,
) -> FastAPI:
    """The coordinator app. `on_admin_key` receives an admin key generated at first start."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        artifact_store = (
            store if store is not None else await asyncio.to_thread(open_store, settings)
        )
        await migrate.upgrade(settings.database_url)
        db = Database(
            settings.database_url,
            busy_timeout_ms=settings.sqlite_busy_timeout_ms,
            pool_size=settings.db_pool_size,
            max_overflow=settings.db_max_overflow,
        )
        the_clock = clock or SystemClock()
        notifier = notifier_for(settings.database_url, db.backend_pids)
        await notifier.start()
        replica = Replica(
            settings=settings,
            db=db,
            store=artifact_store,
            clock=the_clock,
            notifier=notifier,
            signer=await load_signer(db, the_clock.now()),
            fetcher=SafeFetcher(UrlPolicy.from_strings(settings.url_allow_networks)),
            hub=SessionHub(the_clock),
            key_cache=KeyCache(the_clock, settings.key_cache_ttl_sec),
        )
        configured = settings.admin_key.get_secret_value() if settings.admin_key else None
        async with db.write() as session:
            generated = await ensure_admin_key(session, replica.clock.now(), configured)
        if generated is not None:
            (on_admin_key or _log_admin_key)(generated)
        app.state.replica = replica
        relay = await _start_relay(replica)
        await replica_beat.run_once(replica)
        loops = LoopRunner(replica, default_jobs(settings) if settings.run_background_loops else [])
        loops.start()
        try:
            yield
        finally:
            await loops.stop()
            await Sessions.of(replica).release_all()  # none left after `begin_shutdown`
            await _stop_relay(replica, relay)
            await notifier.close()
            await replica.fetcher.aclose()
            await db.dispose()

    app = FastAPI(
        title="GPU Share",
        version=API_VERSION,
        summary="ONNX inference and CatBoost training on remote GPUs",
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
    )
    _install_error_handlers(app)
    app.add_middleware(RequestLimitMiddleware, limits=limits_of(settings))
    app.add_middleware(SecurityHeadersMiddleware)  # refusals get them too
    app.add_middleware(RequestContextMiddleware)  # outermost: every answer has its id, timed
    # Routes are matched in order (a tenth of the server's CPU under agent load went to
    # matching): the agents' and tenants' hot paths first, the pages after the API.
    api = (
        agent_node,
        invokes,
        sessions,
        agent_sessions,
        artifacts,
        health,
        nodes,
        offers,
        tenant_applications,
        agent_benchmarks,
        agent_challenges,
        admin_accounts,
        admin_providers,
        admin_enrollment,
        provider_applications,
        provider_account,
        provider_enrollment,
        provider_reliability,
        provider_prices,
        provider_payouts,
        admin_payouts,
        tenant_billing,
        admin_billing,
        provider_challenges,
        admin_challenges,
        admin_trust,
        provider_trust,
        reservations,
        tenant_spending_limits,
        tenant_webhooks,
        provider_webhooks,
        admin_bank_payouts,
        tenant_statements,
        provider_statements,
        admin_chain_payouts,
        tenant_deposits,
        install,
        admin_metrics,
    )
    add_routes(app, (module.router for module in api))
    site.install(app)
    docs.install(app)
    index_routes(app)
    return app


async def begin_shutdown(app: FastAPI) -> None:
    """Let the server's shutdown begin. Call it once the server takes no new connections,
    before waiting for the requests in flight:

    - long-polls (agents' leases, tenants' `?wait=N`) answer now with what there is, and
      those that come later answer at once: a long-poll left waiting would outlast the
      grace period and be cancelled, which uvicorn answers with a 500;
    - the sessions held here end now (NODE_LOST, saying this process stopped), while the
      agents' channels are still open: the server closes those next, and a session
      ended by that would say its node lost its connection.
    """
    replica: Replica | None = getattr(app.state, "replica", None)
    if replica is not None:
        await replica.notifier.close()
        await Sessions.of(replica).release_all()


def _log_admin_key(key: str) -> None:
    log.warning("generated the admin key (shown only now; store it): %s", key)
