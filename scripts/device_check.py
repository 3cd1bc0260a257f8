"""What a GPU machine looks like to the agent: run it there (`python scripts/device_check.py`).

Prints NVML discovery and one telemetry reading, then the runtimes the agent would
advertise. Exits 1 if NVML lists no GPU or a `*_cuda` runtime is claimed without its
probe having run on the GPU. Needs only nvidia-ml-py, psutil and pydantic from the
agent's dependencies (onnxruntime/catboost are probed if present).
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
