"""How the server and its tools write their logs: plain lines for people, or one JSON
object per line (`GPUSHARE_LOG_FORMAT=json`) for a log pipeline, carrying the ids of what a
line is about — the request, the invoke, the session and the node — when it is known.

The ids live in context variables: whoever learns one binds it (`bind`) and every line
logged from then on in that task says it, through any library's logger.
"""

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from datetime import UTC, datetime

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

request_id: ContextVar[str | None] = ContextVar("request_id", default=None)
invoke_id: ContextVar[str | None] = ContextVar("invoke_id", default=None)
session_id: ContextVar[str | None] = ContextVar("session_id", default=None)
node_id: ContextVar[str | None] = ContextVar("node_id", default=None)
IDS = {
    "request_id": request_id,
    "invoke_id": invoke_id,
    "session_id": session_id,
    "node_id": node_id,
}


@contextmanager
def bound(**ids: str | None) -> Iterator[None]:
    """Lines logged inside say these ids (`request_id=…`, `invoke_id=…`, …)."""
    tokens: list[tuple[ContextVar[str | None], Token[str | None]]] = [
        (IDS[name], IDS[name].set(value)) for name, value in ids.items()
    ]
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: `ts` (UTC, ISO 8601), `level`, `logger`, `message`, the
    ids bound when it was logged, and `exc` with the traceback of an exception."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, var in IDS.items():
            value = var.get()
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def configure(level: str, log_format: str = "text") -> None:
    """The process's root logger: `level` (debug, info, warning), lines as `log_format`
    says (text or json), to standard error."""
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
