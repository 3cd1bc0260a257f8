"""An artifact keeps the name of the file it was uploaded from (`?name=`), on both
databases: checked, stripped of any directory part, returned everywhere it is read."""

import httpx
import pytest

from gpu_share.coordinator.core.settings import Settings
from gpu_share.testing.factories import TenantHandle
from tests.coordinator.services.artifacts.test_artifacts import stored_files, upload


async def test_the_name_given_is_kept_and_returned_by_every_read(
    client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    response = await upload(client, tenant, name="  batch 7.npz ")
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["name"] == "batch 7.npz"

    got = await client.get(f"/v1/artifacts/{body['id']}", headers=tenant.headers)
    assert got.json()["name"] == "batch 7.npz"
    (listed,) = (await client.get("/v1/artifacts", headers=tenant.headers)).json()["items"]
    assert (listed["id"], listed["name"]) == (body["id"], "batch 7.npz")


async def test_an_upload_without_a_name_has_none(
    client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    response = await upload(client, tenant)
    assert response.status_code == 201, response.text
    assert response.json()["name"] is None


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        ("runs/7/inputs.npz", "inputs.npz"),
        ("C:\\fakepath\\inputs.npz", "inputs.npz"),
        ("/abs/olute/ünïcode 名前.npz", "ünïcode 名前.npz"),
    ],
)
async def test_a_directory_part_is_dropped(
    client: httpx.AsyncClient, tenant: TenantHandle, sent: str, kept: str
) -> None:
    response = await upload(client, tenant, name=sent)
    assert response.status_code == 201, response.text
    assert response.json()["name"] == kept


@pytest.mark.parametrize(
    ("sent", "says"),
    [
        ("", "must not be empty"),
        ("   ", "must not be empty"),
        ("runs/7/", "must not be empty"),
        ("x" * 201, "at most 200 characters"),
        ("two\nlines.npz", "printable"),
        ("tab\there.npz", "printable"),
        ("\x1b[31mred.npz", "printable"),
        ("zero\u200bwidth.npz", "printable"),
        ("..", "must name a file"),
    ],
)
async def test_a_bad_name_is_422_naming_the_field_and_stores_nothing(
    client: httpx.AsyncClient, tenant: TenantHandle, settings: Settings, sent: str, says: str
) -> None:
    response = await upload(client, tenant, name=sent)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "VALIDATION_ERROR"
    assert error["message"].startswith("name: ") and says in error["message"]
    assert stored_files(settings) == []
    assert (await client.get("/v1/artifacts", headers=tenant.headers)).json()["items"] == []


async def test_two_hundred_characters_is_long_enough(
    client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    name = "n" * 196 + ".npz"
    response = await upload(client, tenant, name=name)
    assert response.status_code == 201, response.text
    assert response.json()["name"] == name


async def test_the_same_bytes_under_another_name_are_a_second_artifact_with_that_name(
    client: httpx.AsyncClient, tenant: TenantHandle, settings: Settings
) -> None:
    first = (await upload(client, tenant, name="monday.npz")).json()
    second = (await upload(client, tenant, name="tuesday.npz")).json()
    assert first["sha256"] == second["sha256"] and first["id"] != second["id"]
    assert (first["name"], second["name"]) == ("monday.npz", "tuesday.npz")
    assert len(stored_files(settings)) == 1  # the bytes are kept once
    names = {
        a["id"]: a["name"]
        for a in (await client.get("/v1/artifacts", headers=tenant.headers)).json()["items"]
    }
    assert names == {first["id"]: "monday.npz", second["id"]: "tuesday.npz"}


async def test_the_name_is_documented_in_openapi(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    params = {p["name"]: p for p in spec["paths"]["/v1/artifacts"]["post"]["parameters"]}
    assert "directory part is dropped" in params["name"]["description"]
    artifact = spec["components"]["schemas"]["Artifact"]["properties"]["name"]
    assert "uploaded file's name" in artifact["description"]
