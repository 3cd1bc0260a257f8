"""What the URL policy refuses before and at connect time (no traffic leaves loopback)."""

import json
import socket
import subprocess
import sys
from ipaddress import ip_address, ip_network

import pytest

import gpu_share.netguard as netguard
from gpu_share.netguard import (
    ChecksumMismatch,
    FetchFailed,
    FetchTimeout,
    FetchTooLarge,
    UrlForbidden,
    UrlPolicy,
)
from gpu_share.protocol.errors import ErrorCode

DEFAULT = UrlPolicy()


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1/", "loopback"),
        ("http://127.255.0.9:8080/x", "loopback"),
        ("http://10.1.2.3/", "private"),
        ("http://172.16.0.1/", "private"),
        ("http://192.168.1.1/", "private"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://100.64.0.1/", "carrier-grade NAT"),
        ("http://224.0.0.1/", "multicast"),
        ("http://240.0.0.1/", "private|reserved"),
        ("http://255.255.255.255/", "broadcast"),
        ("http://0.0.0.0/", "unspecified"),
        ("http://0.1.2.3/", "private|reserved"),
        ("http://[::]/", "unspecified"),
        ("http://[::1]/", "loopback"),
        ("http://[fd00:ec2::254]/", "unique-local"),
        ("http://[fc00::1]/", "unique-local"),
        ("http://[fe80::1]/", "link-local"),
        ("http://[fec0::1]/", "site-local"),
        ("http://[ff02::1]/", "multicast"),
        ("http://[::ffff:127.0.0.1]/", "IPv4-mapped form of 127.0.0.1, a loopback"),
        ("http://[::ffff:169.254.169.254]/", "IPv4-mapped form of 169.254.169.254"),
        ("http://[::ffff:10.0.0.1]/", "IPv4-mapped form of 10.0.0.1, a private"),
        ("http://[64:ff9b::7f00:1]/", "NAT64 form of 127.0.0.1"),
        ("http://[64:ff9b::a9fe:a9fe]/", "NAT64 form of 169.254.169.254"),
        ("http://[::127.0.0.1]/", "IPv4-compatible form of 127.0.0.1"),
        ("http://[::8.8.8.8]/", "IPv4-compatible"),
        ("http://[2002:7f00:1::]/", "6to4 form of 127.0.0.1"),
        ("http://[2001:db8::1]/", "private"),
    ],
)
def test_non_public_address_literals_are_refused(url: str, reason: str) -> None:
    with pytest.raises(UrlForbidden, match=reason) as caught:
        DEFAULT.check_url(url)
    assert caught.value.code == ErrorCode.URL_FORBIDDEN
    assert "only publicly routable addresses" in caught.value.message


@pytest.mark.parametrize("host", ["2130706433", "0x7f000001", "0177.0.0.1", "127.1", "127.0.0.1."])
def test_numeric_ip_spellings_are_refused_by_the_url_check(host: str) -> None:
    with pytest.raises(UrlForbidden, match=r"non-canonical numeric|not a valid URL"):
        DEFAULT.check_url(f"http://{host}/model.onnx")


@pytest.mark.parametrize("host", ["2130706433", "0x7f000001", "0177.0.0.1", "127.1"])
def test_numeric_ip_spellings_resolve_to_an_address_that_is_refused_too(host: str) -> None:
    resolved = {info[4][0] for info in socket.getaddrinfo(host, 80, type=socket.SOCK_STREAM)}
    assert resolved == {"127.0.0.1"}
    with pytest.raises(UrlForbidden, match="loopback"):
        DEFAULT.check_address(ip_address("127.0.0.1"))


@pytest.mark.parametrize("host", ["2130706433", "0x7f000001", "127.1"])
async def test_resolving_a_numeric_spelling_is_refused(host: str) -> None:
    with pytest.raises(UrlForbidden, match="non-canonical numeric"):
        await DEFAULT.resolve(host, 80)


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "ftp://example.com/model.onnx",
        "gopher://example.com:70/_x",
        "data:text/plain,hello",
        "javascript:alert(1)",
        "example.com/model.onnx",
        "http:///model.onnx",
        "https://",
        "http://[::1",
    ],
)
def test_urls_that_are_not_http_to_a_host_are_refused(url: str) -> None:
    with pytest.raises(UrlForbidden, match=r"http://|no host|not a valid URL"):
        DEFAULT.check_url(url)


def test_url_with_credentials_is_refused_without_echoing_them() -> None:
    with pytest.raises(UrlForbidden, match="user name or password") as caught:
        DEFAULT.check_url("https://alice:s3cret@example.com/model.onnx")
    assert "s3cret" not in caught.value.message


def test_ipv6_zone_identifier_is_refused() -> None:
    with pytest.raises(UrlForbidden, match="zone identifier"):
        DEFAULT.check_url("http://[fe80::1%25eth0]/")


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/models/resnet.onnx?sig=abc",
        "http://8.8.8.8/x",
        "http://[2606:4700::1111]/x",
        "http://[::ffff:8.8.8.8]/x",
        "http://[64:ff9b::808:808]/x",
        "https://EXAMPLE.com./x",
        "https://bücher.example/x",
        "http://1.example/x",
    ],
)
def test_public_urls_pass_the_url_check(url: str) -> None:
    assert DEFAULT.check_url(url).scheme in ("http", "https")


def test_allow_networks_admit_listed_addresses_only() -> None:
    policy = UrlPolicy.from_strings(["127.0.0.0/8", " ", "fd00::/8"])
    assert policy.allow_networks == (ip_network("127.0.0.0/8"), ip_network("fd00::/8"))
    policy.check_url("http://127.0.0.1:8080/x")
    policy.check_url("http://[::ffff:127.0.0.1]:8080/x")
    policy.check_url("http://[fd00:ec2::254]/x")
    with pytest.raises(UrlForbidden, match="private"):
        policy.check_url("http://10.0.0.1/")
    with pytest.raises(UrlForbidden, match="loopback"):
        policy.check_url("http://[::1]/")


def test_from_strings_says_which_entry_is_not_a_network() -> None:
    with pytest.raises(ValueError, match=r"'10.0.0.1/8' is not a network in CIDR form"):
        UrlPolicy.from_strings(["127.0.0.0/8", "10.0.0.1/8"])


def test_allowed_ports_limit_the_port_including_the_default_one() -> None:
    policy = UrlPolicy.from_strings([], allowed_ports=[443])
    policy.check_url("https://example.com/x")
    with pytest.raises(
        UrlForbidden, match=r"port 80 of example.com is not allowed; allowed ports: 443"
    ):
        policy.check_url("http://example.com/x")
    with pytest.raises(UrlForbidden, match="port 8443"):
        policy.check_url("https://example.com:8443/x")


async def test_a_name_resolving_to_loopback_is_refused_with_what_it_resolved_to() -> None:
    with pytest.raises(UrlForbidden) as caught:
        await DEFAULT.resolve("localhost", 80)
    assert caught.value.message.startswith("localhost resolves to 127.0.0.1, a loopback address")


async def test_resolving_an_allowed_name_returns_the_checked_addresses() -> None:
    policy = UrlPolicy.from_strings(["127.0.0.0/8", "::1/128"])
    addresses = await policy.resolve("localhost", 80)
    assert ip_address("127.0.0.1") in addresses


async def test_an_unresolvable_name_fails_as_a_download_failure() -> None:
    with pytest.raises(FetchFailed, match=r"cannot resolve host 'no-such-host.invalid'"):
        await DEFAULT.resolve("no-such-host.invalid", 80)


def test_each_error_carries_its_error_code() -> None:
    assert UrlForbidden("x").code == ErrorCode.URL_FORBIDDEN
    assert FetchFailed("x").code == ErrorCode.DOWNLOAD_FAILED
    assert FetchTooLarge("x").code == ErrorCode.PAYLOAD_TOO_LARGE
    assert FetchTimeout("x").code == ErrorCode.TIMEOUT
    assert ChecksumMismatch("x").code == ErrorCode.CHECKSUM_MISMATCH
    assert str(FetchFailed("what went wrong")) == "what went wrong"


def test_public_names_are_exported() -> None:
    assert set(netguard.__all__) == {
        "ChecksumMismatch",
        "DownloadResult",
        "FetchError",
        "FetchFailed",
        "FetchTimeout",
        "FetchTooLarge",
        "ProbeResult",
        "SafeFetcher",
        "UrlForbidden",
        "UrlPolicy",
    }
    assert all(hasattr(netguard, name) for name in netguard.__all__)


def test_netguard_imports_neither_coordinator_nor_agent() -> None:
    code = "import sys, json, gpu_share.netguard; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout))
    forbidden = {"gpu_share.coordinator", "gpu_share.agent", "fastapi", "sqlalchemy"}
    assert not loaded & forbidden
