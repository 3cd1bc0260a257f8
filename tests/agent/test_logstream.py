"""The job log's shipping (agent/logstream.py): batches while the job runs, the last
lines carried by the result report, and nothing lost or oversized when the coordinator
is away."""

import asyncio

from gpu_share.agent.client import CoordinatorClient
from gpu_share.agent.logstream import LogStream
from gpu_share.protocol.agent import MAX_LOG_APPEND, ResultReport
from gpu_share.protocol.invokes import InvokeError, InvokeStatus
from gpu_share.testing.servers import free_port


def stream(client: CoordinatorClient) -> LogStream:
    return LogStream(
        client,
        "inv_0000000000000000000000",
        "token",
        flush_interval=60,
        canceled=asyncio.Event(),
        dropped=asyncio.Event(),
    )


async def test_the_remainder_is_what_was_not_shipped_and_fits_a_result_report() -> None:
    away = CoordinatorClient(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    try:
        logs = stream(away)
        logs.write("a" * (MAX_LOG_APPEND + 1000))
        logs.line("the last line")
        await logs.flush()  # refused connection: everything is kept for the next try
        tail = await logs.remainder()
    finally:
        await away.aclose()
    assert len(tail) <= MAX_LOG_APPEND
    assert tail.startswith("[agent] earlier log text was lost")
    assert tail.endswith("the last line\n")
    report = ResultReport(
        lease_token="token",
        status=InvokeStatus.FAILED,
        error=InvokeError(code="AGENT_ERROR", message="x"),
        log=tail,
    )
    assert ResultReport.model_validate_json(report.model_dump_json()).log == tail
    assert await logs.remainder() == ""  # taken once
