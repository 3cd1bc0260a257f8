"""What runs inside a job's sandbox, one process per job.

The agent prepares a job directory (the process's working directory) holding
`spec.json` and the downloaded files under `in/`, then runs

    python -m gpu_share.agent.runtimes.<runtime> spec.json

The runtime writes `<outputs_dir>/result.json` (a `RuntimeResult`) and exits 0,
whether the job succeeded or failed for a reason the tenant can fix; a non-zero
exit or a missing result means it crashed, and the agent diagnoses that from the
log. Progress lines go to stderr. `jobspec` holds the agent's side of the
contract (pydantic models), `runner` the runtime's (the standard library only: the
process starts once per job, and whatever it imports is paid on every invoke); each
runtime module imports its heavy library (onnxruntime, CatBoost) itself, so
importing this package costs nothing.
"""
