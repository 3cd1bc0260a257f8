import httpx
from fastapi import FastAPI
from sqlalchemy import event
from gpu_share.testing.factories import TenantHandle
from gpu_share.testing.simulated_agent import AgentFactory
from tests.coordinator.services.work.test_leases import submit


async def test_print_statements(app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory) -> None:
    agent = await sim_agent()
    await submit(client, tenant)
    (job,) = await agent.lease()
    await agent.complete(job)
    statements: list[str] = []
    def seen(_c, _cu, statement, *_):
        statements.append(statement)
        if statement.startswith("SELECT nodes") or statement.startswith("SELECT provider_prices"):
            import traceback; print("".join(l for l in traceback.format_stack() if "gpu_share" in l and "site-packages" not in l))
    engine = app.state.replica.db.engine.sync_engine
    event.listen(engine, "before_cursor_execute", seen)
    for phase in ("submit", "lease", "result"):
        statements.clear()
        if phase == "submit":
            await submit(client, tenant)
        elif phase == "lease":
            (job,) = await agent.lease(start=True)
        else:
            await agent.complete(job)
        print(f"\n===== {phase}: {len(statements)}")
        for s in statements:
            print("   ", " ".join(s.split())[:230])
