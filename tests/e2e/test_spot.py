"""Spot training preempted by on-demand work, then resumed from its snapshot (SPEC §4.3),
through a real coordinator and a real agent process."""

import catboost
import numpy as np
import pytest

from gpu_share.testing.live import Live
from gpu_share.testing.waiting import eventually
from tests.e2e.test_catboost import npz_bytes, outputs_of, train

pytestmark = pytest.mark.slow


async def test_a_spot_training_gives_its_slot_to_on_demand_work_and_resumes(
    live: Live,
) -> None:
    live.agent("one-slot", env={"GPUSHARE_AGENT_CHECKPOINT_INTERVAL_SEC": "1"})  # max_jobs 1
    rng = np.random.default_rng(3)
    X, y = rng.random((4000, 20)), rng.integers(0, 2, 4000)
    iterations = 3000
    spot_id = await train(
        live,
        {
            "task": "classification",
            "iterations": iterations,
            "depth": 6,
            "random_seed": 1,
            "thread_count": 1,
        },
        npz_bytes(X=X, y=y),
        priority="spot",
    )
    await eventually(
        lambda: live.http.get(
            "/v1/artifacts", params={"kind": "checkpoint"}, headers=live.tenant_headers
        ),
        lambda listed: listed.json()["items"],
        what="a snapshot uploaded to the platform",
        detail=live.agent_logs,
    )
    assert (await live.get(spot_id))["status"] == "running"

    urgent_id = await train(
        live,
        {"task": "classification", "iterations": 20, "depth": 3, "thread_count": 1},
        npz_bytes(X=X[:200], y=y[:200]),
    )
    preempted = await live.wait_for(spot_id, lambda s: s["preemptions"] >= 1, timeout=60)
    assert preempted["error"] is None and preempted["status"] in ("queued", "assigned", "running")
    urgent = await live.finished(urgent_id, timeout=120)
    assert urgent["status"] == "done", urgent

    spot = await live.finished(spot_id, timeout=240)
    assert spot["status"] == "done", spot
    assert (spot["preemptions"], spot["attempts"]) == (1, 2)
    assert urgent["finished_at"] < spot["started_at"]  # the on-demand job took the slot first
    extra = spot["result"]["metrics"]["extra"]
    assert extra["resumed"] is True
    run_again = extra["iterations_run_this_attempt"]
    done_before = iterations - run_again  # what the snapshot it resumed from held
    assert done_before > 0 and run_again < iterations
    outputs = await outputs_of(live, spot)
    model = catboost.CatBoostClassifier()
    model.load_model(blob=outputs["model_cbm"].tobytes())
    assert model.tree_count_ == iterations
    logs = await live.logs(spot_id)
    assert "preempted: on-demand work needs this slot" in logs
    assert "requeued (preemption 1); the next attempt resumes from its last checkpoint" in logs
    assert "resuming from a" in logs
