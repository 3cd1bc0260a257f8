"""Why a job failed, in words for the tenant; raised inside the agent, reported as `error`."""

from gpu_share.protocol.errors import ErrorCode


class JobFailed(Exception):
    def __init__(self, code: ErrorCode | str, message: str) -> None:
        super().__init__(message)
        self.code = str(code)
        self.message = message
