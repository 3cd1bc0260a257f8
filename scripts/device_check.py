"""What a GPU machine looks like to the agent: run it there (`python scripts/device_check.py`).

Prints NVML discovery and one telemetry reading, then the runtimes the agent would
advertise (a `*_cuda` runtime only if its probe really ran on the GPU). Exits 1 if
NVML lists no GPU. Needs nvidia-ml-py, psutil and pydantic; onnxruntime and CatBoost
are probed when present.
"""

import json
import sys

from gpu_share.agent.capabilities import detect_runtimes
from gpu_share.agent.gpu import Nvml, telemetry


def main() -> int:
    nvml = Nvml()
    gpus = nvml.discover()
    print(json.dumps([g.info.model_dump() for g in gpus], indent=2))
    print(telemetry(nvml, gpus).model_dump_json(indent=2))
    runtimes = detect_runtimes(gpus)
    print("runtimes:", ", ".join(r.value for r in runtimes))
    nvml.shutdown()
    return 0 if gpus else 1


if __name__ == "__main__":
    sys.exit(main())
