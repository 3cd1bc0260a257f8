"""The tenant console in a real browser against a real coordinator and a real agent:
upload from the page, start an invoke from the form, follow its log, read its result.
Plus what must be refused: another tenant's invoke, an upload without the CSRF header."""

import io
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import quote

import httpx
import numpy as np
from playwright.async_api import Locator, Page, expect

from gpu_share.coordinator.core.settings import Settings
from gpu_share.examples import DIGITS_EXPECTED_LABELS, DIGITS_INPUTS, DIGITS_MODEL
from gpu_share.testing.factories import create_tenant
from gpu_share.testing.live import Live
from gpu_share.testing.simulated_agent import SimulatedAgent
from gpu_share.testing.waiting import eventually
from tests.web.conftest import Browsing

CSRF = re.compile(r'name="csrf" value="([^"]+)"')


async def shoot(page: Page, tmp_path: Path, name: str) -> None:
    """A full-page screenshot in pytest's tmp_path, and in $GPUSHARE_SCREENSHOTS if set."""
    folders = [tmp_path, *([Path(d)] if (d := os.environ.get("GPUSHARE_SCREENSHOTS")) else [])]
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(folder / f"tenant-{name}.png"), full_page=True)


async def sign_in(page: Page, base_url: str, key: str) -> None:
    await page.goto(f"{base_url}/signin")
    await page.get_by_label("API key").fill(key)
    await page.get_by_role("button", name="Sign in").click()
    await page.wait_for_url(f"{base_url}/console")


def nav(page: Page, name: str) -> Locator:
    return page.get_by_role("navigation", name="Main").get_by_role("link", name=name, exact=True)


async def upload(page: Page, path: Path, kind: str) -> None:
    await page.get_by_label("File", exact=True).set_input_files(path)
    await page.get_by_label("Kind", exact=True).select_option(kind)
    await page.get_by_role("button", name="Upload", exact=True).click()
    await page.get_by_text(f"{path.name} is uploaded as").wait_for()


@asynccontextmanager
async def signed_in(base_url: str, key: str) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """An HTTP client holding a console session, and the CSRF token of its pages."""
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        anonymous = CSRF.search((await http.get("/signin")).text)
        assert anonymous is not None
        signed = await http.post("/signin", data={"csrf": anonymous[1], "key": key})
        assert signed.status_code == 303, signed.text
        token = CSRF.search((await http.get("/console")).text)
        assert token is not None
        yield http, token[1]


def key_of(headers: dict[str, str]) -> str:
    return headers["Authorization"].removeprefix("Bearer ")


async def test_a_tenant_uploads_starts_and_follows_an_invoke_in_the_browser(
    live: Live, browsing: Browsing, tmp_path: Path
) -> None:
    live.agent()  # a real agent process; it registers while the tenant uploads
    page = browsing.page
    await sign_in(page, live.base_url, key_of(live.tenant_headers))
    assert await page.get_by_text("No invokes yet").is_visible()
    await shoot(page, tmp_path, "overview-empty")

    await nav(page, "Artifacts").click()
    assert await page.get_by_text("No artifacts yet: upload a model below").is_visible()
    await shoot(page, tmp_path, "artifacts-empty")
    await upload(page, DIGITS_MODEL, "model")
    await upload(page, DIGITS_INPUTS, "inputs")
    rows = page.locator("main table tbody tr")
    assert await rows.count() == 2
    assert "inputs" in await rows.nth(0).inner_text()  # newest first
    assert "model" in await rows.nth(1).inner_text()
    # Each under the name of the file it came from, its id beside it.
    await expect(rows.nth(0).locator(".artifact-name")).to_have_text(DIGITS_INPUTS.name)
    await expect(rows.nth(1).locator(".artifact-name")).to_have_text(DIGITS_MODEL.name)
    await expect(rows.nth(1)).to_contain_text(re.compile(r"art_[0-9a-z]{26}"))
    await shoot(page, tmp_path, "artifacts")

    await nav(page, "Invokes").click()

    async def runtimes_offered() -> int:
        await page.reload()
        return await page.locator("select#runtime").count()

    await eventually(  # the form offers its runtimes once the agent's node is online
        runtimes_offered, what="the invoke form offering the agent's runtimes", every=0.2
    )
    await page.get_by_label("Runtime", exact=True).select_option("onnx_cpu")
    model_choice = page.locator("select#model option").first
    await expect(model_choice).to_have_text(re.compile(rf"^{re.escape(DIGITS_MODEL.name)} \(art_…"))
    await expect(page.locator("select#inputs option").nth(1)).to_contain_text(DIGITS_INPUTS.name)
    await page.get_by_label("Inputs", exact=True).select_option(index=1)  # the NPZ just uploaded
    await page.get_by_label("Timeout (seconds)").fill("120")
    await shoot(page, tmp_path, "invokes-form")
    await page.get_by_role("button", name="Start invoke").click()
    await page.wait_for_url(re.compile(r"/console/invokes/inv_[0-9a-z]{26}$"))
    invoke_id = page.url.rsplit("/", 1)[1]

    log = page.locator("pre.log")
    await expect(log).to_contain_text("[agent ", timeout=120_000)  # lines as they come
    await page.locator("#metrics").wait_for(timeout=120_000)  # final: the page reloaded once
    final = (await page.locator("#invoke-status").inner_text()).strip()
    assert final == "done", await page.locator("main").inner_text()
    assert "bytes inline" in await log.inner_text()  # the agent's last line is there
    assert (await page.locator("#device").inner_text()).strip() == "cpu"
    outputs = await page.locator("#outputs").inner_text()
    assert "label" in outputs
    assert str(DIGITS_EXPECTED_LABELS) in outputs  # [7, 6, 3, 7, 7, 3, 2, 8]
    await shoot(page, tmp_path, "invoke-done")

    async with page.expect_download() as download_info:
        await page.get_by_role("link", name=re.compile("Download outputs")).click()
    saved = await (await download_info.value).path()
    with np.load(saved) as npz:
        assert npz["label"].tolist() == DIGITS_EXPECTED_LABELS

    await nav(page, "Invokes").click()
    assert invoke_id in await page.locator("main table").inner_text()
    await shoot(page, tmp_path, "invokes")
    await page.get_by_role("link", name="Done", exact=True).click()
    assert invoke_id in await page.locator("main table").inner_text()
    await page.get_by_role("link", name="Failed", exact=True).click()
    assert await page.get_by_text("No invokes match this filter.").is_visible()

    await nav(page, "Overview").click()
    assert invoke_id in await page.locator("main table").inner_text()
    assert "onnx_cpu" in await page.locator(".console-stats").inner_text()
    assert live.base_url in await page.locator("#curl-example").inner_text()
    await shoot(page, tmp_path, "overview")

    await nav(page, "Nodes").click()
    nodes = await page.locator("main").inner_text()
    assert "online" in nodes
    assert "90 %" in nodes  # where a new node starts: its provider had no score yet
    await shoot(page, tmp_path, "nodes")

    await nav(page, "Sessions").click()
    assert await page.get_by_text("No open sessions").is_visible()
    await shoot(page, tmp_path, "sessions")
    assert browsing.outside == []  # nothing was fetched from the internet


async def test_keys_are_issued_once_and_revoked_but_not_the_one_signed_in_with(
    live: Live, browsing: Browsing, tmp_path: Path
) -> None:
    page = browsing.page
    await sign_in(page, live.base_url, key_of(live.tenant_headers))
    await nav(page, "Keys").click()
    assert await page.get_by_text("in use here").is_visible()
    await page.get_by_role("button", name="Issue a new key").click()
    assert await page.get_by_text("Copy this key now.").is_visible()
    new_key = (await page.locator("#new-key").inner_text()).strip()
    assert new_key.startswith("gpu_sk_")
    await shoot(page, tmp_path, "keys-issued")
    auth = {"Authorization": f"Bearer {new_key}"}
    assert (await live.http.get("/v1/gpu/runtimes", headers=auth)).status_code == 200

    await page.get_by_role("button", name=re.compile(r"^Revoke")).click()
    assert await page.get_by_text("is revoked: programs using it now get 401").is_visible()
    assert await page.locator(".badge.s-revoked").count() == 1
    await shoot(page, tmp_path, "keys")
    assert (await live.http.get("/v1/gpu/runtimes", headers=auth)).status_code == 401

    # The page offers no button for the key this browser signed in with; a forged form
    # for it gets the service's refusal, shown as a message.
    own = (await page.locator("tr", has_text="in use here").get_attribute("id")) or ""
    csrf = await page.locator("input[name=csrf]").first.input_value()
    refused = await page.request.post(
        f"{live.base_url}/console/keys/{own}/revoke", form={"csrf": csrf}
    )
    assert refused.status == 409
    assert "a key cannot revoke itself" in await refused.text()


async def test_only_its_tenant_sees_an_invoke_and_cancels_it_from_its_page(
    live: Live, browsing: Browsing, tmp_path: Path
) -> None:
    agent = SimulatedAgent(live.base_url)  # online, but takes no work: the invoke waits
    await agent.register(live.enrollment_token)
    model = await live.upload(DIGITS_MODEL.read_bytes(), "model")
    async with agent.beating():  # online when the invoke is placed, however loaded the machine
        theirs = await live.invoke(model_url=model)
    intruder = await create_tenant(live.http, "Intruder Inc")
    async with signed_in(live.base_url, intruder.key) as (http, csrf):
        for path in ("", "/log", "/outputs"):
            response = await http.get(f"/console/invokes/{theirs}{path}")
            assert response.status_code == 404, path
        canceled = await http.post(f"/console/invokes/{theirs}/cancel", data={"csrf": csrf})
        assert canceled.status_code == 404
        assert (await http.get("/console/invokes/not-an-id")).status_code == 404
        mine = await http.get("/console/invokes")
        assert mine.status_code == 200
        assert theirs not in mine.text
    assert (await live.get(theirs))["status"] == "queued"

    page = browsing.page
    await sign_in(page, live.base_url, key_of(live.tenant_headers))
    await page.goto(f"{live.base_url}/console/invokes/{theirs}")
    assert (await page.locator("#invoke-status").inner_text()).strip() == "queued"
    await shoot(page, tmp_path, "invoke-queued")
    await page.get_by_role("button", name="Cancel invoke").click()
    assert await page.get_by_text("The invoke is canceled.").is_visible()
    assert (await page.locator("#invoke-status").inner_text()).strip() == "canceled"
    assert await page.get_by_role("button", name="Cancel invoke").count() == 0
    assert (await live.get(theirs))["status"] == "canceled"
    await agent.aclose()


async def test_the_new_invoke_form_says_what_is_wrong_next_to_each_field(live: Live) -> None:
    agent = SimulatedAgent(live.base_url)
    await agent.register(live.enrollment_token)
    await live.upload(DIGITS_MODEL.read_bytes(), "model")
    inputs_url = await live.upload(DIGITS_INPUTS.read_bytes(), "inputs")
    inputs_id = inputs_url.split("/")[-2]
    async with (
        agent.beating(),  # online: onnx_cpu is offered, whatever else is wrong
        signed_in(live.base_url, key_of(live.tenant_headers)) as (http, csrf),
    ):
        form = {"csrf": csrf, "runtime": "onnx_cpu", "model": inputs_id, "timeout_sec": "0"}
        answer = await http.post("/console/invokes", data=form)
        assert answer.status_code == 422
        assert 'id="timeout_sec-error"' in answer.text
        assert "A whole number of seconds from 1 to" in answer.text
        assert 'id="model-error"' in answer.text
        assert "That artifact is of kind inputs; onnx_cpu needs one of kind model." in answer.text
        listed = await live.http.get("/v1/gpu/invokes", headers=live.tenant_headers)
        assert listed.json()["items"] == []  # nothing was started
        forged = await http.post("/console/invokes", data={**form, "csrf": "forged"})
        assert forged.status_code == 403
    await agent.aclose()


async def test_the_upload_refuses_a_request_without_the_csrf_header(live: Live) -> None:
    model = DIGITS_MODEL.read_bytes()
    url = "/console/artifacts/upload?kind=model&name=digits.onnx"
    async with signed_in(live.base_url, key_of(live.tenant_headers)) as (http, csrf):
        bare = await http.post(url, content=model)
        assert bare.status_code == 403
        assert bare.json()["error"]["code"] == "FORBIDDEN"
        wrong = await http.post(url, content=model, headers={"X-CSRF-Token": "x" + csrf})
        assert wrong.status_code == 403
        stored = await live.http.get("/v1/artifacts", headers=live.tenant_headers)
        assert stored.json()["items"] == []  # nothing was kept

        hostile = quote("<img src=x onerror=alert(1)>.onnx")
        accepted = await http.post(
            f"/console/artifacts/upload?kind=model&name={hostile}",
            content=model,
            headers={"X-CSRF-Token": csrf},
        )
        assert accepted.status_code == 201, accepted.text
        assert accepted.json()["next"] == "/console/artifacts"
        listed = await http.get("/console/artifacts")  # the flash names the file, escaped
        assert "&lt;img src=x onerror=alert(1)&gt;.onnx is uploaded as" in listed.text
        assert "<img src=x" not in listed.text
    async with httpx.AsyncClient(base_url=live.base_url) as anonymous:
        signed_out = await anonymous.post(url, content=model, headers={"X-CSRF-Token": csrf})
        assert signed_out.status_code == 401


async def test_an_upload_over_the_quota_says_why_and_a_delete_makes_room(
    live: Live, browsing: Browsing, settings: Settings, tmp_path: Path
) -> None:
    settings.tenant_quota_bytes = DIGITS_MODEL.stat().st_size + 100  # the server's own object
    page = browsing.page
    await sign_in(page, live.base_url, key_of(live.tenant_headers))
    await page.goto(f"{live.base_url}/console/artifacts")
    await upload(page, DIGITS_MODEL, "model")

    await page.get_by_label("File", exact=True).set_input_files(DIGITS_INPUTS)
    await page.get_by_label("Kind", exact=True).select_option("inputs")
    await page.get_by_role("button", name="Upload", exact=True).click()
    note = page.locator("[data-upload-status]")
    await expect(note).to_contain_text("artifact quota exceeded")
    await shoot(page, tmp_path, "artifacts-over-quota")
    assert await page.locator("main table tbody tr").count() == 1  # nothing else was kept

    await page.get_by_role("button", name=f"Delete {DIGITS_MODEL.name} (art_", exact=False).click()
    assert await page.get_by_text(re.compile(r"Artifact art_\w+ is deleted\.")).is_visible()
    assert await page.get_by_text("No artifacts yet: upload a model below").is_visible()
    await upload(page, DIGITS_INPUTS, "inputs")  # room again


async def test_a_file_that_is_not_what_its_kind_promises_is_an_error_and_a_model_shows_its_io(
    live: Live, browsing: Browsing, tmp_path: Path
) -> None:
    """The inputs NPZ sent as a model: the form says why in red, nothing is kept. The
    model itself then lists what it takes and returns on its row."""
    page = browsing.page
    await sign_in(page, live.base_url, key_of(live.tenant_headers))
    await page.goto(f"{live.base_url}/console/artifacts")
    await page.get_by_label("File", exact=True).set_input_files(DIGITS_INPUTS)
    await page.get_by_label("Kind", exact=True).select_option("model")
    await page.get_by_role("button", name="Upload", exact=True).click()
    note = page.locator("[data-upload-status]")
    await expect(note).to_contain_text(
        "the file is not an ONNX model: it is a zip archive, such as an NPZ of inputs "
        "(upload those with kind=inputs)"
    )
    await expect(note).to_have_class(re.compile(r"\berror\b"))
    await shoot(page, tmp_path, "artifacts-wrong-kind")
    await page.reload()
    assert await page.get_by_text("No artifacts yet: upload a model below").is_visible()
    assert not await page.get_by_text("is uploaded as").count()

    await upload(page, DIGITS_MODEL, "model")
    row = page.locator("main table tbody tr")
    await expect(row).to_have_count(1)
    await expect(row).to_contain_text("Inputs: input: float32[?,64]")
    await expect(row).to_contain_text("Outputs: label: int64[?], probabilities: float32[?,10]")
    await shoot(page, tmp_path, "artifacts-model-signature")


async def test_an_invoke_page_previews_no_outputs_that_would_inflate_past_its_limit(
    live: Live,
) -> None:
    """A node returns the outputs: a 130 KB inline NPZ that inflates to 128 MiB is judged
    by its headers and not previewed (nor inflated); a normal one is."""
    agent = SimulatedAgent(live.base_url)
    await agent.register(live.enrollment_token)
    model = await live.upload(DIGITS_MODEL.read_bytes(), "model")
    bomb, normal = io.BytesIO(), io.BytesIO()
    np.savez_compressed(bomb, y=np.zeros(128 * 1024 * 1024, dtype=np.uint8))
    np.savez(normal, y=np.arange(3, dtype=np.float32))
    assert len(bomb.getvalue()) < 256 * 1024
    pages = {}
    async with agent.beating():  # online, and its leases held, however loaded the machine
        for outputs in (bomb.getvalue(), normal.getvalue()):
            invoke_id = await live.invoke(model_url=model)
            (job,) = await agent.lease()
            await agent.complete(job, outputs)
            async with signed_in(live.base_url, key_of(live.tenant_headers)) as (http, _):
                page = await http.get(f"/console/invokes/{invoke_id}")
            assert page.status_code == 200
            pages[len(outputs)] = page.text
    inflating, small = pages[len(bomb.getvalue())], pages[len(normal.getvalue())]
    assert "First values" not in inflating and "of npz, returned with the result" in inflating
    assert "First values" in small and "[0., 1., 2.]" in small
    await agent.aclose()
