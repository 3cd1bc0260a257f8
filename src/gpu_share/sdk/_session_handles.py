"""What `Client.session()` and `AsyncClient.session()` hand out: a loaded model to call.

    with client.session("model.onnx", runtime="onnx_cuda") as s:
        outputs = s.forward({"input": batch})      # dict of numpy arrays

With `recreate=True`, a session that ended under you (its node went away, it idled
out) is opened again with the same model and the forward is sent once more.
"""

import contextlib
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Self, TypeVar

from gpu_share.protocol.sessions import Session
from gpu_share.sdk import _sessions
from gpu_share.sdk._config import ClientConfig
from gpu_share.sdk._http import Flow
from gpu_share.sdk.errors import Gone, GpuShareError, SessionClosed

ENDED = (SessionClosed, Gone)  # the session is over; `recreate` opens a new one

T = TypeVar("T")


class SessionHandle:
    def __init__(
        self,
        config: ClientConfig,
        run: Callable[[Flow[Any]], Any],
        reopen: Callable[[], Session],
        *,
        recreate: bool,
    ) -> None:
        self._config = config
        self._run = run
        self._reopen = reopen
        self._recreate = recreate
        self.info: Session = reopen()

    @property
    def id(self) -> str:
        return self.info.id

    def forward(self, inputs: Mapping[str, Any] | Any) -> dict[str, Any]:
        try:
            outputs: dict[str, Any] = self._run(_sessions.forward(self._config, self.id, inputs))
        except ENDED:
            if not self._recreate:
                raise
            self.info = self._reopen()
            outputs = self._run(_sessions.forward(self._config, self.id, inputs))
        return outputs

    def refresh(self) -> Session:
        self.info = self._run(_sessions.get_session(self._config, self.id))
        return self.info

    def close(self) -> None:
        with contextlib.suppress(*ENDED):  # already ended: nothing to close
            self.info = self._run(_sessions.close_session(self._config, self.id))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncSessionHandle:
    def __init__(
        self,
        config: ClientConfig,
        run: Callable[[Flow[Any]], Coroutine[Any, Any, Any]],
        reopen: Callable[[], Coroutine[Any, Any, Session]],
        *,
        recreate: bool,
    ) -> None:
        self._config = config
        self._run = run
        self._reopen = reopen
        self._recreate = recreate
        self.info: Session | None = None

    @property
    def id(self) -> str:
        if self.info is None:
            raise GpuShareError("the session is not open yet: use `async with client.session(…)`")
        return self.info.id

    async def open(self) -> Self:
        self.info = await self._reopen()
        return self

    async def forward(self, inputs: Mapping[str, Any] | Any) -> dict[str, Any]:
        try:
            outputs: dict[str, Any] = await self._run(
                _sessions.forward(self._config, self.id, inputs)
            )
        except ENDED:
            if not self._recreate:
                raise
            self.info = await self._reopen()
            outputs = await self._run(_sessions.forward(self._config, self.id, inputs))
        return outputs

    async def refresh(self) -> Session:
        self.info = await self._run(_sessions.get_session(self._config, self.id))
        return self.info

    async def close(self) -> None:
        if self.info is None:
            return
        with contextlib.suppress(*ENDED):
            self.info = await self._run(_sessions.close_session(self._config, self.id))

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
