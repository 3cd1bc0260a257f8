"""`AsyncClient`: the asyncio tenant client; the same flows as `Client`, awaited."""

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import date
from decimal import Decimal
from types import TracebackType
from typing import Any, Self, TypeVar, Unpack

import httpx

from gpu_share.protocol.artifacts import Artifact, ArtifactKind
from gpu_share.protocol.billing import Balance, Quote, Usage, UsageGroup
from gpu_share.protocol.common import Page
from gpu_share.protocol.deposits import Deposit
from gpu_share.protocol.health import Health
from gpu_share.protocol.invokes import Invoke, InvokeStatus, ProbeUrlResult
from gpu_share.protocol.nodes import Node, RuntimeAvailability
from gpu_share.protocol.reservations import Reservation, ReservationQuote
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.protocol.sessions import Session
from gpu_share.protocol.spending_limits import SpendingLimits
from gpu_share.protocol.statements import TenantStatement
from gpu_share.protocol.webhooks import (
    TENANT_EVENTS,
    DeliveryStatus,
    WebhookDelivery,
    WebhookDeliveryDetail,
    WebhookEndpoint,
    WebhookEndpointCreated,
    WebhookSecret,
)
from gpu_share.sdk import (
    _api,
    _catboost,
    _money,
    _reservations,
    _sessions,
    _webhook_endpoints,
)
from gpu_share.sdk._api import ArraysOrFile, InvokeOptions, StatusCallback
from gpu_share.sdk._config import DEFAULT_TIMEOUT, ClientConfig, RetryPolicy
from gpu_share.sdk._http import AsyncDriver, Flow
from gpu_share.sdk._reservations import ReservationFields
from gpu_share.sdk._results import InvokeOutputs
from gpu_share.sdk._session_handles import AsyncSessionHandle
from gpu_share.sdk._sources import FileSource

T = TypeVar("T")


class AsyncClient:
    """A GPU Share tenant client for asyncio; see `Client` for what each method does.

    `base_url` and `api_key` default to `GPU_SHARE_BASE_URL` and `GPU_SHARE_API_KEY`.
    Requests that are safe to repeat (all of them: `invoke` carries an automatic
    `Idempotency-Key`) are retried per `retry`. `transport` is handed to httpx, e.g.
    to talk to an app in-process in tests. Use it as an async context manager, or `aclose()`.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        poll_interval: float | None = None,
        max_poll_interval: float | None = None,
        progress: bool | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.config = ClientConfig.resolve(
            base_url,
            api_key,
            timeout=timeout,
            retry=retry,
            poll_interval=poll_interval,
            max_poll_interval=max_poll_interval,
            progress=progress,
        )
        self._http = httpx.AsyncClient(
            base_url=self.config.base_url,
            headers=self.config.headers(),
            timeout=timeout,
            transport=transport,
        )
        self._driver = AsyncDriver(self._http)

    @property
    def base_url(self) -> str:
        return self.config.base_url

    def __repr__(self) -> str:
        return f"AsyncClient({self.config.base_url!r})"

    async def _run(self, flow: Flow[T]) -> T:
        return await self._driver.run(flow)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # Discovery

    async def health(self) -> Health:
        """Needs no key; a degraded server answers `status="degraded"` rather than raising."""
        return await self._run(_api.health(self.config))

    async def nodes(self) -> list[Node]:
        return await self._run(_api.nodes(self.config))

    async def runtimes(self) -> list[RuntimeAvailability]:
        return await self._run(_api.runtimes(self.config))

    async def probe_url(self, url: str) -> ProbeUrlResult:
        return await self._run(_api.probe_url(self.config, url))

    # Artifacts

    async def upload_artifact(
        self,
        source: FileSource,
        kind: ArtifactKind | str,
        *,
        reuse: bool = True,
        name: str | None = None,
    ) -> Artifact:
        """Streams `source` (path, bytes or binary file) under `name`, else the file's own
        name (bytes and unnamed streams go up without one). An identical live artifact of
        yours is returned instead of uploading again unless `reuse=False`: one under the
        same name if there is one, else any, which keeps the name it was uploaded under."""
        return await self._run(
            _api.upload_artifact(self.config, source, kind, reuse=reuse, name=name)
        )

    async def artifacts(
        self,
        *,
        kind: ArtifactKind | str | None = None,
        sha256: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Page[Artifact]:
        return await self._run(
            _api.list_artifacts(self.config, kind=kind, sha256=sha256, limit=limit, cursor=cursor)
        )

    async def delete_artifact(self, artifact_id: str) -> None:
        await self._run(_api.delete_artifact(self.config, artifact_id))

    # Invokes

    async def invoke(
        self,
        runtime: RuntimeName | str,
        model_url: str,
        inputs_url: str | None = "",
        *,
        wait: float = 0.0,
        **options: Unpack[InvokeOptions],
    ) -> Invoke:
        """Queue a job by URL; returns at once (`status="queued"`), or with `wait`
        (seconds, up to 60) once it has ended if that is sooner (`Prefer: wait`)."""
        return await self._run(
            _api.invoke(self.config, runtime, model_url, inputs_url, options, wait=wait)
        )

    async def quote(
        self,
        runtime: RuntimeName | str,
        model_url: str,
        inputs_url: str | None = "",
        **options: Unpack[InvokeOptions],
    ) -> Quote:
        """What `invoke` with the same arguments would cost now: the node it would go to,
        its rate, the most it may cost and what it is expected to; nothing is queued."""
        return await self._run(_api.quote(self.config, runtime, model_url, inputs_url, options))

    # Billing

    async def balance(self) -> Balance:
        """What this tenant can spend now, and what is held for its running work."""
        return await self._run(_api.balance(self.config))

    async def usage(
        self,
        *,
        start: str | None = None,
        end: str | None = None,
        group: UsageGroup | str = UsageGroup.DAY,
    ) -> Usage:
        """Charges summed per UTC day or per runtime; `start`/`end`: YYYY-MM-DD."""
        return await self._run(_api.usage(self.config, start=start, end=end, group=group))

    async def spending_limits(self) -> SpendingLimits:
        """The monthly cap and low-balance threshold in force, and this month's spend."""
        return await self._run(_api.spending_limits(self.config))

    async def set_spending_limits(
        self,
        *,
        monthly_cap: Decimal | str | int | None = None,
        low_balance: Decimal | str | int | None = None,
    ) -> SpendingLimits:
        """Set both limits, in USDC ("50"); None removes one. New work that would take
        the month's spend past the cap is refused (402 SPENDING_LIMIT); running work is
        not stopped. Below `low_balance` you are mailed once."""
        return await self._run(
            _api.set_spending_limits(self.config, monthly_cap=monthly_cap, low_balance=low_balance)
        )

    async def get_invoke(self, invoke_id: str) -> Invoke:
        return await self._run(_api.get_invoke(self.config, invoke_id))

    async def invokes(
        self,
        *,
        status: InvokeStatus | str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Page[Invoke]:
        return await self._run(
            _api.list_invokes(self.config, status=status, limit=limit, cursor=cursor)
        )

    async def wait(
        self,
        invoke: Invoke | str,
        timeout: float | None = None,
        *,
        poll_interval: float | None = None,
        max_poll_interval: float | None = None,
        on_status: StatusCallback | None = None,
    ) -> Invoke:
        """The invoke once `done`; raises `InvokeFailed` (and subclasses) if it ended
        otherwise, `WaitTimeout` after `timeout` seconds (the invoke goes on).

        Each status request is a long-poll that comes back as soon as the invoke ends;
        other changes (`on_status`) are seen every `poll_interval`, growing ×1.5 up to
        `max_poll_interval`. Given the `Invoke` that `invoke()` answered rather than its
        id, the wait starts from it."""
        return await self._run(
            _api.wait(
                self.config,
                invoke,
                timeout,
                poll_interval=poll_interval,
                max_poll_interval=max_poll_interval,
                on_status=on_status,
            )
        )

    async def outputs(self, invoke: Invoke | str) -> InvokeOutputs:
        """The outputs of a done invoke (inline, or downloaded from the platform)."""
        if isinstance(invoke, str):
            invoke = await self.get_invoke(invoke)
        return await self._run(_api.outputs(self.config, invoke))

    async def invoke_and_wait(
        self,
        runtime: RuntimeName | str,
        model: ArraysOrFile,
        inputs: ArraysOrFile = None,
        *,
        wait_timeout: float | None = None,
        poll_interval: float | None = None,
        on_status: StatusCallback | None = None,
        **options: Unpack[InvokeOptions],
    ) -> InvokeOutputs:
        """Upload what is local (paths, bytes, files, numpy arrays; URLs are used as they
        are), invoke, wait, and return the outputs."""
        return await self._run(
            _api.invoke_and_wait(
                self.config,
                runtime,
                model,
                inputs,
                options,
                wait_timeout=wait_timeout,
                poll_interval=poll_interval,
                on_status=on_status,
            )
        )

    async def logs(self, invoke_id: str) -> str:
        return await self._run(_api.logs(self.config, invoke_id))

    async def follow_logs(
        self, invoke_id: str, *, poll_interval: float = 1.0
    ) -> AsyncIterator[str]:
        """Log text as it arrives, until the invoke has ended and everything is read."""
        after = 0
        while True:
            page = await self._run(_api.logs_page(self.config, invoke_id, after))
            if page.text:
                yield page.text
                after = page.cursor
                continue
            if page.status.terminal:
                return
            await asyncio.sleep(poll_interval)

    async def cancel(self, invoke_id: str) -> Invoke:
        """Queued: canceled at once. Running: its node stops it shortly."""
        return await self._run(_api.cancel(self.config, invoke_id))

    # Reservations

    async def quote_reservation(self, **fields: Unpack[ReservationFields]) -> ReservationQuote:
        return await self._run(_reservations.quote_reservation(self.config, fields))

    async def reserve(self, **fields: Unpack[ReservationFields]) -> Reservation:
        return await self._run(_reservations.reserve(self.config, fields))

    async def reservations(self, *, limit: int = 100) -> Page[Reservation]:
        return await self._run(_reservations.list_reservations(self.config, limit=limit))

    async def get_reservation(self, reservation_id: str) -> Reservation:
        return await self._run(_reservations.get_reservation(self.config, reservation_id))

    async def cancel_reservation(self, reservation_id: str) -> Reservation:
        return await self._run(_reservations.cancel_reservation(self.config, reservation_id))

    # Top-ups and statements

    async def request_deposit(self, amount: Decimal | str | int | None = None) -> Deposit:
        """Where to send USDC on Solana (`address`, or `solana_pay_url` for a wallet) and
        the `reference` to add to the transfer: each finalized transfer naming it is
        credited once, with what arrived. `amount` only fills in the wallet's form.
        Raises `Conflict` where the platform takes no USDC top-ups."""
        return await self._run(_money.request_deposit(self.config, amount))

    async def deposits(self) -> list[Deposit]:
        """The latest 20 deposit requests, newest first, each with the transfers credited."""
        return await self._run(_money.list_deposits(self.config))

    async def statement(self, month: date | str) -> TenantStatement:
        """What the UTC month (YYYY-MM, or any date in it) cost, by runtime and by GPU
        model, refunds netted; the current month is `complete=False`."""
        return await self._run(_money.statement(self.config, month))

    async def statement_csv(self, month: date | str) -> str:
        """The same statement as CSV text: a line per runtime, per GPU model, and the total."""
        return await self._run(_money.statement_csv(self.config, month))

    # Webhooks

    async def webhook_endpoints(self) -> list[WebhookEndpoint]:
        return await self._run(_webhook_endpoints.list_endpoints(self.config))

    async def add_webhook_endpoint(
        self, url: str, *, events: Sequence[str] = TENANT_EVENTS
    ) -> WebhookEndpointCreated:
        """Send this account's `events` (`topup.credited`) to `url`. The first endpoint's
        answer carries the signing `secret`, shown this once; later ones carry None."""
        return await self._run(_webhook_endpoints.add_endpoint(self.config, url, events))

    async def delete_webhook_endpoint(self, endpoint_id: str) -> None:
        """It takes no new event; deliveries already queued for it are still sent."""
        await self._run(_webhook_endpoints.delete_endpoint(self.config, endpoint_id))

    async def rotate_webhook_secret(self) -> WebhookSecret:
        """A new signing secret, shown this once (the first, if there was none); the
        previous one signs deliveries too until `previous_valid_until` (24 hours)."""
        return await self._run(_webhook_endpoints.rotate_secret(self.config))

    async def webhook_deliveries(
        self, *, status: DeliveryStatus | str | None = None, limit: int = 100
    ) -> list[WebhookDelivery]:
        """Deliveries to this account's endpoints and `webhook_url`s, newest first;
        `status`: pending, delivered or failed."""
        return await self._run(
            _webhook_endpoints.list_deliveries(self.config, status=status, limit=limit)
        )

    async def get_webhook_delivery(self, delivery_id: str) -> WebhookDeliveryDetail:
        """The body sent, byte for byte as signed, and every attempt with its answer."""
        return await self._run(_webhook_endpoints.get_delivery(self.config, delivery_id))

    async def replay_webhook_delivery(self, delivery_id: str) -> WebhookDelivery:
        """Send it again within seconds with the same webhook-id, retried anew if it fails."""
        return await self._run(_webhook_endpoints.replay_delivery(self.config, delivery_id))

    # Sessions

    def session(
        self,
        model: ArraysOrFile,
        runtime: RuntimeName | str = RuntimeName.ONNX_CUDA,
        *,
        recreate: bool = False,
        ready_timeout: float = 600.0,
        **options: Any,
    ) -> AsyncSessionHandle:
        """Like `Client.session`; use it with `async with`."""

        async def reopen() -> Session:
            flow = _sessions.open_session(
                self.config, model, runtime, options, ready_timeout=ready_timeout
            )
            session: Session = await self._run(flow)
            return session

        return AsyncSessionHandle(self.config, self._run, reopen, recreate=recreate)

    # Training

    async def train_catboost(
        self,
        X: Any,
        y: Any,
        params: Mapping[str, Any] | None = None,
        eval_set: tuple[Any, ...] | None = None,
        cat_features: Sequence[int | str] | None = None,
        gpu: bool = True,
        *,
        task: str | None = None,
        group_id: Any = None,
        weight: Any = None,
        feature_names: Sequence[str] | None = None,
        eval_fraction: float | None = None,
        outputs: Sequence[str] = ("cbm",),
        wait_timeout: float | None = None,
        load_model: bool = True,
        **options: Unpack[InvokeOptions],
    ) -> _catboost.TrainedModel:
        """Train on the platform and return `(model, report)`: a loaded CatBoost model and
        its metrics, learning curves and feature importances.

        Loading needs catboost, checked before anything is uploaded. `load_model=False`
        needs no catboost: `model` is None and the model's bytes are `report.model_cbm`."""
        return await self._run(
            _catboost.train_catboost(
                self.config,
                X,
                y,
                params,
                eval_set=eval_set,
                cat_features=cat_features,
                gpu=gpu,
                task=task,
                group_id=group_id,
                weight=weight,
                feature_names=feature_names,
                eval_fraction=eval_fraction,
                outputs=outputs,
                wait_timeout=wait_timeout,
                load_model=load_model,
                options=options,
            )
        )
