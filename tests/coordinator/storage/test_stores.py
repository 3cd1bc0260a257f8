"""The artifact store's contract, run against a local directory and a real S3 endpoint."""

import hashlib
import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.storage import ArtifactStore, LocalArtifactStore, open_store
from gpu_share.coordinator.storage.s3 import (
    PART_BYTES,
    S3ArtifactStore,
    StorageUnavailable,
    _S3Sink,
)
from gpu_share.testing.s3 import S3Endpoint


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ArtifactStore]:
    if request.param == "local":
        yield LocalArtifactStore(tmp_path / "artifacts")
        return
    endpoint: S3Endpoint = request.getfixturevalue("s3_endpoint")
    yield S3ArtifactStore.open(endpoint.create_bucket(), endpoint_url=endpoint.url)


def publish(store: ArtifactStore, key: str, *pieces: bytes) -> None:
    sink = store.begin_upload()
    for piece in pieces:
        sink.write(piece)
    store.commit(sink, key)
    sink.abort()  # what the service does after every upload: a no-op once committed


def test_a_committed_upload_reads_back_whole_under_its_key(store: ArtifactStore) -> None:
    publish(store, "k1", b"hello ", b"world")
    assert b"".join(store.read("k1")) == b"hello world"
    assert store.exists("k1")
    assert list(store.keys()) == ["k1"]
    assert store.sweep_temporary(0) == 0  # the upload left no temporary object behind


def test_an_upload_of_several_parts_keeps_every_byte(store: ArtifactStore) -> None:
    """Larger than two S3 parts, written in pieces that do not line up with them."""
    data = os.urandom(2 * PART_BYTES + 12345)
    pieces = [data[i : i + 3_000_001] for i in range(0, len(data), 3_000_001)]
    publish(store, "big", *pieces)
    read = b"".join(store.read("big", chunk_size=1 << 20))
    assert hashlib.sha256(read).digest() == hashlib.sha256(data).digest()


def test_nothing_is_visible_before_the_commit_and_an_abort_leaves_nothing(
    store: ArtifactStore, request: pytest.FixtureRequest
) -> None:
    sink = store.begin_upload()
    sink.write(os.urandom(PART_BYTES + 1))  # on S3: one part is uploaded already
    sink.write(b"tail")
    assert list(store.keys()) == []
    sink.abort()
    sink.abort()
    assert list(store.keys()) == []
    assert store.sweep_temporary(0) == 0
    if isinstance(store, S3ArtifactStore):
        endpoint: S3Endpoint = request.getfixturevalue("s3_endpoint")
        bucket = store._store.config["bucket"]
        assert endpoint.multipart_uploads(bucket) == []  # the parts were aborted too


def test_read_back_gives_what_was_written_seekable(store: ArtifactStore) -> None:
    data = os.urandom(PART_BYTES + 7)
    sink = store.begin_upload()
    sink.write(data[:100])
    sink.write(data[100:])
    with sink.read_back() as file:
        assert file.read(100) == data[:100]
        file.seek(0)
        assert file.read() == data
    store.commit(sink, "checked")
    assert b"".join(store.read("checked")) == data


def test_an_aborted_read_back_publishes_nothing(store: ArtifactStore) -> None:
    sink = store.begin_upload()
    sink.write(b"refused by its kind's check")
    with sink.read_back() as file:
        assert file.read() == b"refused by its kind's check"
    sink.abort()
    assert list(store.keys()) == []
    assert store.sweep_temporary(0) == 0


def test_delete_removes_and_a_missing_key_is_no_error(store: ArtifactStore) -> None:
    publish(store, "gone", b"x")
    store.delete("gone")
    store.delete("gone")
    store.delete("never-was")
    assert not store.exists("gone")
    with pytest.raises(FileNotFoundError):
        b"".join(store.read("gone"))


def test_the_same_key_published_twice_holds_the_last_bytes(store: ArtifactStore) -> None:
    publish(store, "same", b"first")
    publish(store, "same", b"second")
    assert b"".join(store.read("same")) == b"second"


@pytest.mark.parametrize("bad", ["", "a/b", ".hidden", "../up"])
def test_a_key_that_is_not_a_plain_name_is_refused(store: ArtifactStore, bad: str) -> None:
    sink = store.begin_upload()
    sink.write(b"x")
    with pytest.raises(ValueError, match="bad storage key"):
        store.commit(sink, bad)
    sink.abort()
    with pytest.raises(ValueError, match="bad storage key"):
        store.exists(bad)


def test_the_sweep_removes_abandoned_uploads_and_keeps_young_ones(store: ArtifactStore) -> None:
    """A crashed process's upload: complete in storage but never committed."""
    sink = store.begin_upload()
    sink.write(b"abandoned")
    if isinstance(sink, _S3Sink):
        sink.finish()  # a multipart upload in parts is the bucket's lifecycle rule's
    assert store.sweep_temporary(3600) == 0  # younger than an hour: may be in flight
    assert store.sweep_temporary(0) == 1
    assert store.sweep_temporary(0) == 0
    publish(store, "kept", b"x")
    assert store.sweep_temporary(0) == 0
    assert store.exists("kept")


def test_download_links_are_the_s3_stores_alone(store: ArtifactStore) -> None:
    publish(store, "linked", b"the bytes")
    url = store.download_url("linked", timedelta(minutes=5))
    if not store.presigns:
        assert url is None
        return
    assert url is not None
    response = httpx.get(url)  # no credentials but the link's own signature
    assert response.status_code == 200
    assert response.content == b"the bytes"
    assert "X-Amz-Signature=" in url and "X-Amz-Expires=300" in url


def test_links_are_signed_for_the_address_agents_reach(s3_endpoint: S3Endpoint) -> None:
    bucket = s3_endpoint.create_bucket()
    public = s3_endpoint.url.replace("127.0.0.1", "localhost")
    store = S3ArtifactStore.open(bucket, endpoint_url=s3_endpoint.url, public_endpoint_url=public)
    publish(store, "k", b"reached")
    url = store.download_url("k", timedelta(minutes=1))
    assert url is not None and url.startswith(f"{public}/{bucket}/objects/k?")
    assert httpx.get(url).content == b"reached"


def test_a_missing_bucket_stops_the_start_saying_which(
    s3_endpoint: S3Endpoint, tmp_path: Path
) -> None:
    settings = Settings(
        data_dir=tmp_path,
        storage="s3",
        s3_bucket="no-such-bucket",
        s3_endpoint_url=s3_endpoint.url,
    )
    with pytest.raises(StorageUnavailable, match=r"'no-such-bucket' at http://127\.0\.0\.1"):
        open_store(settings)


def test_s3_settings_need_a_bucket_and_objects_one_copy_can_publish(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="GPUSHARE_S3_BUCKET"):
        Settings(data_dir=tmp_path, storage="s3")
    with pytest.raises(ValueError, match="GPUSHARE_MAX_OUTPUT_BYTES"):
        Settings(data_dir=tmp_path, storage="s3", s3_bucket="b", max_output_bytes=6 * 1024**3)
    assert isinstance(open_store(Settings(data_dir=tmp_path)), LocalArtifactStore)
