"""A real agent with `GPUSHARE_AGENT_LOG_FORMAT=json`: every line is one JSON object, and
the lines about a job name its invoke and the node."""

import json

import pytest

from gpu_share.examples import DIGITS_MODEL
from gpu_share.testing.live import Live
from gpu_share.testing.waiting import eventually

pytestmark = pytest.mark.slow


async def test_the_agents_json_lines_name_the_node_and_the_invoke(live: Live) -> None:
    agent = live.agent(
        env={"GPUSHARE_AGENT_LOG_FORMAT": "json"}, sandbox="process", log_level="debug"
    )
    invoke_id = await live.invoke(model_url=await live.upload(DIGITS_MODEL.read_bytes(), "model"))
    state = await live.finished(invoke_id)
    assert state["status"] == "done"

    async def job_lines() -> list[dict[str, object]]:
        lines = [json.loads(line) for line in agent.log.splitlines() if line.strip()]
        return [line for line in lines if line.get("invoke_id") == invoke_id]

    about_the_job = await eventually(  # logged once the coordinator answered the report
        job_lines,
        lambda lines: any(x["message"] == f"invoke {invoke_id}: done, reported" for x in lines),
        what="the agent logs the job's report",
        detail=live.agent_logs,
    )
    assert {line.get("node_id") for line in about_the_job} == {state["node_id"]}
