"""A coordinator storing artifacts in a real S3 endpoint, and a real agent: the agent
fetches the model and inputs from the bucket through presigned links, never through the
coordinator, and large outputs land in the bucket and reach the tenant."""

import hashlib
import io
import re

import httpx
import numpy as np
import pytest

from gpu_share.coordinator.core.settings import Settings
from gpu_share.examples import DIGITS_EXPECTED_LABELS, DIGITS_INPUTS, DIGITS_MODEL
from gpu_share.testing.live import Live
from gpu_share.testing.s3 import S3Endpoint

pytestmark = pytest.mark.slow


@pytest.fixture
def settings(settings: Settings, s3_endpoint: S3Endpoint) -> Settings:
    settings.inline_output_limit_bytes = 0  # every output goes to platform storage
    return s3_endpoint.use_for(settings)


def npz(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


async def test_the_agent_fetches_from_the_bucket_and_outputs_land_there(
    live: Live, settings: Settings, s3_endpoint: S3Endpoint
) -> None:
    live.agent()
    model_url = await live.upload(DIGITS_MODEL.read_bytes(), "model")
    inputs_url = await live.upload(DIGITS_INPUTS.read_bytes(), "inputs")
    invoke_id = await live.invoke(model_url=model_url, inputs_url=inputs_url)
    state = await live.finished(invoke_id)
    assert state["status"] == "done", state
    assert state["result"].get("outputs_inline_base64") is None

    # The tenant's download goes through the coordinator (it checks the key) and is read
    # from the bucket.
    outputs_url = state["result"]["outputs_url"]
    assert outputs_url.startswith(f"{live.base_url}/v1/artifacts/")
    response = await live.http.get(outputs_url, headers=live.tenant_headers)
    assert response.status_code == 200, response.text
    assert npz(response.content)["label"].tolist() == DIGITS_EXPECTED_LABELS

    # Model, inputs and outputs are objects of the bucket, each stored once.
    store = live.replica.store if live.replica else None
    assert store is not None and store.presigns
    assert len(list(store.keys())) == 3

    # The agent read model and inputs from the bucket with presigned GETs; the coordinator
    # read only the outputs (with its own credentials, for the tenant's download).
    log = s3_endpoint.log_path.read_text(errors="replace")
    for data, through in ((DIGITS_MODEL, "link"), (DIGITS_INPUTS, "link"), (response, "us")):
        digest = hashlib.sha256(
            data.content if isinstance(data, httpx.Response) else data.read_bytes()
        ).hexdigest()
        gets = re.findall(rf'"GET /{settings.s3_bucket}/objects/{digest}-\S+ HTTP', log)
        assert gets, f"no GET of {digest} in {log[-3000:]}"
        presigned = ["X-Amz-Signature=" in get for get in gets]
        assert all(presigned) if through == "link" else not any(presigned), gets
