"""`LinkPeers` (`http/peer_client.py`) against a real relay listener: one kept link per
holder carries requests at once, answers find their requests, the holder's refusals are
raised as they were raised there, and a holder that stops or dies says which it did."""

import asyncio
from collections.abc import AsyncIterator

import pytest

from gpu_share.coordinator.core.errors import ApiError, Conflict
from gpu_share.coordinator.core.signing import UrlSigner
from gpu_share.coordinator.http.peer_client import LinkPeers
from gpu_share.coordinator.http.relay_frames import address
from gpu_share.coordinator.http.relay_listener import RelayListener
from gpu_share.coordinator.replica.peers import PeerAnswer, PeerUnreachable, RelayCall
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.sessions import SessionStatus

SIGNER = UrlSigner(b"k" * 32)
LIMIT = 1024 * 1024


class Holder:
    """A listener whose sessions answer a forward after `fields["sleep"]` seconds with the
    payload reversed, refuse the session `ses_gone`, and fail on `ses_bug`."""

    def __init__(self) -> None:
        self.calls: list[RelayCall] = []
        self.listener = RelayListener(self.handle, SIGNER, "127.0.0.1", 0, max_body=LIMIT)

    async def handle(self, call: RelayCall) -> PeerAnswer:
        self.calls.append(call)
        if call.session_id == "ses_gone":
            raise Conflict("the session ended", code=ErrorCode.SESSION_CLOSED, details={"a": 1})
        if call.session_id == "ses_bug":
            raise RuntimeError("a bug in the holder")
        if call.session_id == "ses_odd":
            raise Conflict("refused", details={"not json": object()})
        await asyncio.sleep(float(call.fields.get("format") or 0))
        return PeerAnswer(format=call.action, body=call.body[::-1])


@pytest.fixture
async def holder() -> AsyncIterator[Holder]:
    holder = Holder()
    await holder.listener.start()
    yield holder
    await holder.listener.stop()


@pytest.fixture
async def peers() -> AsyncIterator[LinkPeers]:
    peers = LinkPeers(SIGNER, max_body=LIMIT)
    yield peers
    await peers.aclose()


async def test_requests_at_once_share_one_link_and_each_gets_its_own_answer(
    holder: Holder, peers: LinkPeers
) -> None:
    url = holder.listener.url
    # the slowest sent first: answers come back in the order they end, not as asked
    answers = await asyncio.gather(
        *(peers.forward(url, "ten_1", "ses_1", f"0.{9 - i}", bytes([i]) * 3) for i in range(8))
    )
    assert [a.body for a in answers] == [bytes([i]) * 3 for i in range(8)]
    assert {a.format for a in answers} == {"forward"}
    assert holder.listener.links == 1
    await peers.forward(url, "ten_1", "ses_1", "0", b"again")
    assert holder.listener.links == 1


async def test_a_refusal_there_is_raised_here_as_it_was_raised(
    holder: Holder, peers: LinkPeers
) -> None:
    with pytest.raises(ApiError) as refused:
        await peers.forward(holder.listener.url, "ten_1", "ses_gone", "0", b"x")
    assert refused.value.code is ErrorCode.SESSION_CLOSED
    assert refused.value.message == "the session ended"
    assert refused.value.details == {"a": 1}
    with pytest.raises(ApiError) as failed:
        await peers.close(holder.listener.url, "ses_bug", "done", SessionStatus.CLOSED)
    assert failed.value.code is ErrorCode.INTERNAL
    assert "reference" in failed.value.message
    with pytest.raises(ApiError) as unwritable:  # a refusal that is not JSON still answers
        await peers.forward(holder.listener.url, "t", "ses_odd", "0", b"x")
    assert unwritable.value.code is ErrorCode.INTERNAL
    assert (await peers.forward(holder.listener.url, "t", "ses_1", "0", b"ab")).body == b"ba"
    close = holder.calls[1]
    assert (close.action, close.fields) == ("close", {"reason": "done", "status": "closed"})


async def test_a_holder_that_does_not_answer_in_time_fails_that_request_alone(
    holder: Holder, peers: LinkPeers, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gpu_share.coordinator.http.peer_client.FORWARD_TIMEOUT_SEC", 0.2)
    with pytest.raises(PeerUnreachable) as late:
        await peers.forward(holder.listener.url, "ten_1", "ses_1", "0.6", b"x")
    assert not late.value.gone
    assert "no answer in 0.2 s" in str(late.value)
    assert (await peers.forward(holder.listener.url, "t", "ses_1", "0", b"xy")).body == b"yx"
    await asyncio.sleep(0.5)  # the late answer arrives on the link and is dropped
    assert (await peers.forward(holder.listener.url, "t", "ses_1", "0", b"12")).body == b"21"


async def test_a_holder_gone_is_told_from_a_link_that_broke(
    holder: Holder, peers: LinkPeers, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gpu_share.coordinator.http.relay_listener.STOP_GRACE_SEC", 0.2)
    url = holder.listener.url
    assert (await peers.forward(url, "t", "ses_1", "0", b"ok")).body == b"ko"
    in_flight = asyncio.create_task(peers.forward(url, "t", "ses_1", "30", b"x"))
    await asyncio.sleep(0.2)
    await holder.listener.stop()  # the request in flight outlasts the stop's grace
    with pytest.raises(PeerUnreachable) as broke:
        await in_flight
    assert not broke.value.gone  # a link can break on the way: the caller retries
    with pytest.raises(PeerUnreachable) as gone:
        await peers.forward(url, "t", "ses_1", "0", b"x")
    assert gone.value.gone  # nothing listens there any more


async def test_a_process_without_the_key_is_refused_as_a_peer(holder: Holder) -> None:
    stranger = LinkPeers(UrlSigner(b"x" * 32), max_body=LIMIT)
    try:
        with pytest.raises(PeerUnreachable, match="refused this one as a peer") as refused:
            await stranger.forward(holder.listener.url, "t", "ses_1", "0", b"x")
    finally:
        await stranger.aclose()
    assert not refused.value.gone
    assert holder.calls == []


async def test_an_address_of_another_version_is_not_taken_for_a_dead_process(
    holder: Holder, peers: LinkPeers
) -> None:
    host, port = address(holder.listener.url)
    with pytest.raises(PeerUnreachable, match="not a relay address of this version") as old:
        await peers.forward(f"http://{host}:{port}", "t", "ses_1", "0", b"x")
    assert not old.value.gone
