"""Which URLs and addresses the fetcher may reach, how that is enforced, and the errors.

Every URL a tenant can name (a model URL, a webhook, an outputs upload target) is
fetched by a machine inside someone's network, so only globally routable addresses
are allowed unless an operator lists a network explicitly (tests list loopback).

The check happens where the connection is made: `_CheckedBackend` resolves the host
itself, refuses if any address is forbidden, and connects to an address it checked.
Nothing resolves the name again between the check and the connect, so DNS rebinding
cannot slip a private address in. TLS still verifies, and sends SNI for, the original
host name: httpcore starts TLS with the origin's host, not the address connected to.

    FetchError                 code: an ErrorCode value; message: for humans
     ├── UrlForbidden          URL_FORBIDDEN      scheme, host, address or port not allowed
     ├── FetchFailed           DOWNLOAD_FAILED    DNS, connect, TLS, HTTP >= 400, redirects
     ├── FetchTooLarge         PAYLOAD_TOO_LARGE  declared or streamed size over the cap
     ├── FetchTimeout          TIMEOUT            the whole operation ran past its time
     └── ChecksumMismatch      CHECKSUM_MISMATCH  body's sha256 is not the expected one
"""

import ipaddress
import re
import socket
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

import anyio
import httpcore
import httpx

from gpu_share.protocol.errors import ErrorCode

IPAddress = IPv4Address | IPv6Address
IPNetwork = IPv4Network | IPv6Network


class FetchError(Exception):
    code: str = ErrorCode.DOWNLOAD_FAILED

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UrlForbidden(FetchError):
    code = ErrorCode.URL_FORBIDDEN


class FetchFailed(FetchError):
    code = ErrorCode.DOWNLOAD_FAILED


class FetchTooLarge(FetchError):
    code = ErrorCode.PAYLOAD_TOO_LARGE


class FetchTimeout(FetchError):
    code = ErrorCode.TIMEOUT


class ChecksumMismatch(FetchError):
    code = ErrorCode.CHECKSUM_MISMATCH


_PUBLIC_ONLY = "only publicly routable addresses are fetched"
_SCHEMES = ("http", "https")
_CGNAT = IPv4Network("100.64.0.0/10")
_BROADCAST = IPv4Address("255.255.255.255")
_NAT64 = IPv6Network("64:ff9b::/96")
_IPV4_COMPATIBLE = IPv6Network("::/96")
_UNIQUE_LOCAL = IPv6Network("fc00::/7")
# A label of a numeric IPv4 spelling that inet_aton accepts: decimal, octal or hex.
_NUMERIC_LABEL = re.compile(r"(0x[0-9a-f]*|[0-9]+)")


def _embedded_ipv4(ip: IPv6Address) -> tuple[IPv4Address, str] | None:
    """The IPv4 address an IPv6 form carries, with the form's name.

    The kernel or a translator on the path delivers these to the IPv4 address, so
    the IPv4 address is what must be judged.
    """
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped, "IPv4-mapped"
    if ip in _NAT64:
        return IPv4Address(int(ip) & 0xFFFFFFFF), "NAT64"
    if ip.sixtofour is not None:
        return ip.sixtofour, "6to4"
    if ip.teredo is not None:
        return ip.teredo[1], "Teredo"
    return None


def _forbidden_reason(ip: IPAddress) -> str | None:
    """Why `ip` must not be fetched from, as a phrase ("a loopback address"), or None."""
    if isinstance(ip, IPv6Address):
        embedded = _embedded_ipv4(ip)
        if embedded is not None:
            inner, form = embedded
            inner_reason = _forbidden_reason(inner)
            if inner_reason is not None:
                return f"the {form} form of {inner}, {inner_reason}"
            if form in ("IPv4-mapped", "NAT64"):
                return None  # the IPv4 address is the whole destination, and it is public
        elif ip in _IPV4_COMPATIBLE and int(ip) > 1:
            inner = IPv4Address(int(ip))
            return f"a deprecated IPv4-compatible form of {inner}"
    if ip.is_unspecified:
        return "the unspecified address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address (where cloud metadata services listen)"
    if isinstance(ip, IPv4Address):
        if ip in _CGNAT:
            return "a carrier-grade NAT (shared) address"
        if ip == _BROADCAST:
            return "the broadcast address"
    elif ip.is_site_local:
        return "a site-local address"
    elif ip in _UNIQUE_LOCAL:
        return "a unique-local (private) address"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_private:
        return "a private address"
    if ip.is_reserved:
        return "a reserved address"
    if not ip.is_global:
        return "not a globally routable address"
    return None


def _numeric_spelling(host: str) -> bool:
    """True for hosts like "2130706433", "0x7f000001", "0177.0.0.1" or "127.1".

    Resolvers read these as IPv4 addresses, but they are not the canonical form
    `ipaddress` parses, so they would slip past a check of literal addresses.
    """
    labels = host.lower().rstrip(".").split(".")
    return all(_NUMERIC_LABEL.fullmatch(label) for label in labels)


def _literal_address(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _default_port(url: httpx.URL) -> int:
    return url.port if url.port is not None else (443 if url.scheme == "https" else 80)


@dataclass(frozen=True)
class UrlPolicy:
    """What may be fetched: public addresses, plus `allow_networks`, on `allowed_ports`."""

    allow_networks: tuple[IPNetwork, ...] = ()
    allowed_ports: frozenset[int] | None = None

    @classmethod
    def from_strings(
        cls, cidrs: Iterable[str], *, allowed_ports: Iterable[int] | None = None
    ) -> "UrlPolicy":
        """A policy from settings text such as ["10.20.0.0/16", "127.0.0.1"]."""
        networks: list[IPNetwork] = []
        for text in cidrs:
            if not text.strip():
                continue
            try:
                networks.append(ipaddress.ip_network(text.strip()))
            except ValueError as exc:
                raise ValueError(
                    f"{text!r} is not a network in CIDR form (such as 10.0.0.0/8): {exc}"
                ) from None
        ports = None if allowed_ports is None else frozenset(allowed_ports)
        return cls(allow_networks=tuple(networks), allowed_ports=ports)

    def check_url(self, url: str) -> httpx.URL:
        """Parse `url` and refuse what can be refused before any network traffic."""
        try:
            parsed = httpx.URL(url)
        except (httpx.InvalidURL, TypeError) as exc:
            raise UrlForbidden(f"{url!r} is not a valid URL: {exc}") from None
        if parsed.scheme not in _SCHEMES:
            shown = f"scheme {parsed.scheme!r}" if parsed.scheme else "no scheme"
            raise UrlForbidden(f"{url!r} has {shown}; only http:// and https:// URLs are fetched")
        host = parsed.host
        if not host:
            raise UrlForbidden(f"{url!r} has no host")
        if parsed.userinfo:
            raise UrlForbidden(
                f"{parsed.scheme}://{host}/… carries a user name or password in the URL; "
                "credentials in URLs are not accepted"
            )
        self.check_host(host)
        port = _default_port(parsed)
        if self.allowed_ports is not None and port not in self.allowed_ports:
            allowed = ", ".join(str(p) for p in sorted(self.allowed_ports))
            raise UrlForbidden(f"port {port} of {host} is not allowed; allowed ports: {allowed}")
        return parsed

    def check_host(self, host: str) -> None:
        """Refuse a host whose spelling alone is forbidden: a bad literal or numeric trick."""
        if "%" in host:
            raise UrlForbidden(f"{host!r} carries an IPv6 zone identifier; these are not fetched")
        literal = _literal_address(host)
        if literal is not None:
            self.check_address(literal)
        elif _numeric_spelling(host):
            raise UrlForbidden(
                f"{host!r} is a non-canonical numeric IP address; "
                "write an IPv4 address as four decimal numbers (a.b.c.d) or use a host name"
            )

    def check_address(self, ip: IPAddress) -> None:
        if self._explicitly_allowed(ip):
            return
        reason = _forbidden_reason(ip)
        if reason is not None:
            raise UrlForbidden(f"{ip} is {reason}; {_PUBLIC_ONLY}")

    async def resolve(self, host: str, port: int) -> list[IPAddress]:
        """Every address `host` resolves to, each checked; refuses if any is forbidden.

        Refusing the whole name when one address is bad (rather than picking a good
        one) keeps a name from smuggling a private address past a later resolution.
        """
        self.check_host(host)
        literal = _literal_address(host)
        if literal is not None:
            return [literal]
        try:
            infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise FetchFailed(f"cannot resolve host {host!r}: {why}") from None
        addresses: list[IPAddress] = []
        for *_, sockaddr in infos:
            ip = ipaddress.ip_address(sockaddr[0])
            if ip in addresses:
                continue
            if not self._explicitly_allowed(ip):
                reason = _forbidden_reason(ip)
                if reason is not None:
                    raise UrlForbidden(f"{host} resolves to {ip}, {reason}; {_PUBLIC_ONLY}")
            addresses.append(ip)
        if not addresses:
            raise FetchFailed(f"cannot resolve host {host!r}: no addresses")
        return addresses

    def _explicitly_allowed(self, ip: IPAddress) -> bool:
        candidates: list[IPAddress] = [ip]
        if isinstance(ip, IPv6Address) and ip.ipv4_mapped is not None:
            candidates.append(ip.ipv4_mapped)
        return any(
            candidate.version == network.version and candidate in network
            for candidate in candidates
            for network in self.allow_networks
        )


class _CheckedBackend(httpcore.AsyncNetworkBackend):
    """Connects only to addresses the policy accepts, and only to those it checked."""

    def __init__(self, policy: UrlPolicy) -> None:
        self._policy = policy
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            with anyio.fail_after(timeout):
                addresses = await self._policy.resolve(host, port)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"resolving {host} took over {timeout}s") from None
        failure: httpcore.ConnectError | httpcore.ConnectTimeout | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    str(address), port, timeout, local_address, socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None  # resolve() returns at least one address
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise UrlForbidden("unix sockets are never fetched from")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _CheckedTransport(httpx.AsyncHTTPTransport):
    """httpx's own transport (request and error mapping) over a pool of checked connections.

    httpx offers no hook for the network backend, so the pool it built is replaced;
    the fetcher tests fail if a later httpx stops reading `_pool`.
    """

    def __init__(self, policy: UrlPolicy, ssl_context: ssl.SSLContext) -> None:
        super().__init__(verify=ssl_context, trust_env=False)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context,
            max_connections=100,
            max_keepalive_connections=20,
            keepalive_expiry=5.0,
            network_backend=_CheckedBackend(policy),
        )


def checked_transport(policy: UrlPolicy, ssl_context: ssl.SSLContext) -> httpx.AsyncBaseTransport:
    """An httpx transport that connects only to addresses `policy` accepts."""
    return _CheckedTransport(policy, ssl_context)
