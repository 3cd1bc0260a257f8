"""What routers depend on: the coordinator's runtime and the base URL for links."""

from typing import Annotated

from fastapi import Depends, Request
from starlette.requests import HTTPConnection

from gpu_share.coordinator.runtime import Runtime


def get_runtime(connection: HTTPConnection) -> Runtime:
    runtime: Runtime = connection.app.state.runtime
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


def base_url(runtime: Runtime, request: Request) -> str:
    """The public URL to put into links: configured, else what this request came in on."""
    return runtime.settings.public_base_url or str(request.base_url).rstrip("/")
