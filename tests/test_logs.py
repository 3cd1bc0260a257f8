"""`gpu_share.logs`: JSON lines with the ids bound when each was logged."""

import io
import json
import logging
from collections.abc import Iterator

import pytest

from gpu_share import logs


@pytest.fixture
def root_restored() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)


def formatted(record_message: str, exc: BaseException | None = None) -> dict[str, object]:
    record = logging.LogRecord(
        "gpu_share.x",
        logging.ERROR,
        __file__,
        1,
        record_message,
        None,
        (type(exc), exc, exc.__traceback__) if exc else None,
    )
    line: dict[str, object] = json.loads(logs.JsonFormatter().format(record))
    return line


def test_a_line_says_when_how_bad_where_and_what_with_the_ids_bound() -> None:
    with logs.bound(request_id="req-1", invoke_id="inv_9"):
        line = formatted('quoted "text" and ünïcode\nacross lines')
    assert line["message"] == 'quoted "text" and ünïcode\nacross lines'
    assert (line["level"], line["logger"]) == ("error", "gpu_share.x")
    assert str(line["ts"]).endswith("+00:00")
    assert (line["request_id"], line["invoke_id"]) == ("req-1", "inv_9")
    assert "node_id" not in line and "session_id" not in line
    assert "request_id" not in formatted("later")  # unbound on leaving


def test_an_exception_comes_with_its_traceback() -> None:
    try:
        raise ValueError("broken")
    except ValueError as exc:
        line = formatted("failed", exc)
    assert "ValueError: broken" in str(line["exc"])
    assert "Traceback" in str(line["exc"])


def test_configure_writes_json_lines_or_plain_text(
    root_restored: None, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.configure("info", "json")
    logging.getLogger("gpu_share.y").info("one %s", "line")
    logging.getLogger("gpu_share.y").debug("below the level")
    (line,) = capsys.readouterr().err.splitlines()
    assert json.loads(line)["message"] == "one line"
    logs.configure("warning", "text")
    logging.getLogger("gpu_share.y").warning("plain")
    assert capsys.readouterr().err.rstrip().endswith("WARNING gpu_share.y: plain")


def test_bound_ids_nest_and_are_unbound_on_leaving(root_restored: None) -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.JsonFormatter())
    logging.getLogger().addHandler(handler)
    with logs.bound(node_id="node_1"):
        with logs.bound(node_id="node_2", session_id="ses_1"):
            logging.getLogger("gpu_share.z").warning("inner")
        logging.getLogger("gpu_share.z").warning("outer")
    logging.getLogger("gpu_share.z").warning("none")
    inner, outer, none = (json.loads(x) for x in out.getvalue().splitlines())
    assert (inner["node_id"], inner["session_id"]) == ("node_2", "ses_1")
    assert outer["node_id"] == "node_1" and "session_id" not in outer
    assert "node_id" not in none
