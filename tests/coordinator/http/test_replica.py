"""What a request says about where it came from: the client's address (believed from
`X-Forwarded-For` only when a proxy the operator named sent it), and the URLs put into
links (never the request's `Host` for links anyone else follows)."""

from types import SimpleNamespace

import pytest
from starlette.requests import HTTPConnection

from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.http.replica import client_address

PROXY = "10.0.0.2"


def connection(peer: str, *forwarded: str, trusted: list[str]) -> HTTPConnection:
    """A request as the app receives it, from `peer`, with `X-Forwarded-For` headers."""
    settings = Settings(trusted_proxies=trusted)
    app = SimpleNamespace(state=SimpleNamespace(replica=SimpleNamespace(settings=settings)))
    headers = [(b"x-forwarded-for", value.encode()) for value in forwarded]
    scope = {"type": "http", "client": (peer, 50000), "headers": headers, "app": app}
    return HTTPConnection(scope)


def test_without_trusted_proxies_the_header_is_ignored() -> None:
    assert client_address(connection("198.51.100.7", "203.0.113.9", trusted=[])) == "198.51.100.7"


def test_a_peer_that_is_not_a_trusted_proxy_cannot_name_another_client() -> None:
    forged = connection("198.51.100.7", "203.0.113.9", trusted=[PROXY])
    assert client_address(forged) == "198.51.100.7"


def test_behind_a_trusted_proxy_the_client_is_the_address_it_forwarded() -> None:
    assert client_address(connection(PROXY, "203.0.113.9", trusted=[PROXY])) == "203.0.113.9"


@pytest.mark.parametrize(
    ("headers", "client"),
    [
        # What the client wrote itself stands left of what our proxies appended.
        (["1.2.3.4, 203.0.113.9"], "203.0.113.9"),
        (["1.2.3.4", "203.0.113.9, 10.0.0.3"], "203.0.113.9"),  # two headers, two proxies
        (["203.0.113.9, 10.0.0.3, 10.0.0.4"], "203.0.113.9"),
        (["10.0.0.3"], "10.0.0.3"),  # only proxies: the farthest one
        (["not-an-address"], PROXY),  # no proxy of ours writes that
        (["1.2.3.4, garbage, 10.0.0.3"], "10.0.0.3"),
        ([], PROXY),
    ],
)
def test_the_client_is_the_right_most_hop_no_trusted_proxy_holds(
    headers: list[str], client: str
) -> None:
    assert client_address(connection(PROXY, *headers, trusted=["10.0.0.0/24"])) == client


def test_ipv6_proxies_and_clients() -> None:
    forwarded = connection("fd00::2", "2001:db8::7, fd00::3", trusted=["fd00::/64"])
    assert client_address(forwarded) == "2001:db8::7"


def test_a_proxy_setting_that_is_not_an_address_fails_at_start() -> None:
    with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6 network"):
        Settings(trusted_proxies="10.0.0.2, proxy.internal")


def test_mail_links_never_come_from_a_request_but_from_the_settings() -> None:
    assert Settings(public_base_url="https://gpu.example/").mail_base_url == "https://gpu.example"
    assert Settings(host="127.0.0.1", port=9000).mail_base_url == "http://127.0.0.1:9000"
    assert Settings(host="0.0.0.0", port=9000).mail_base_url == "http://localhost:9000"
    assert Settings(host="::1", port=9000).mail_base_url == "http://[::1]:9000"
