"""Which URLs the agent may make us fetch: a guard against server-side request forgery.

The model writes the URLs, so a page (or a prompt injection in one) could ask us to read
`http://169.254.169.254/` (cloud credentials), `http://localhost:9092/` or a host inside the
network. `check_url` refuses anything but public http(s) hosts, and the fetcher calls it again on
every redirect hop.

DNS rebinding: a host can resolve to a public address when checked and to a private one when
connected to. `PinnedTransport` closes that gap: its connections resolve the host once, check every
address against the same policy, and connect to the checked address itself (TLS still verifies
the certificate against the host name). Clients built without it only get the pre-flight check.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx
import msgspec

from asearcher.consumers.tools.backends import ToolError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# NAT64 (RFC 6052) embeds an IPv4 address in the last 32 bits; on a NAT64 network it reaches that
# IPv4 host, so the embedded address must pass the check too.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
# Local-use NAT64 prefixes (RFC 8215) reach hosts inside the network by definition.
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
# IPv4-compatible (RFC 4291, deprecated) and IPv4-translated (RFC 2765) addresses also carry an
# IPv4 address in their last 32 bits, and some stacks still route them to it: `[::127.0.0.1]`.
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
_IPV4_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")
_UNIQUE_LOCAL = ipaddress.IPv6Network("fc00::/7")


class UrlPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """What the fetcher may reach and how much it may download."""

    # Fetch loopback, private, link-local, multicast, reserved... addresses (never in production).
    allow_private: bool = False
    # Exceptions to the address check: "host" (any port) or "host:port", e.g. "127.0.0.1:8123".
    allowed_hosts: list[str] = []
    # Largest response body (after decompression) before the fetch is refused.
    max_bytes: int = 5_000_000
    # Time limit for one fetch, all redirect hops and the body included.
    timeout_s: float = 20.0
    # Most redirects followed (each hop is checked again).
    max_redirects: int = 5

    def __post_init__(self) -> None:
        if self.max_bytes < 1 or self.timeout_s <= 0 or self.max_redirects < 0:
            raise ValueError("UrlPolicy needs max_bytes >= 1, timeout_s > 0, max_redirects >= 0")

    def allows_host(self, host: str, port: int) -> bool:
        """Whether `host` (on `port`) is an explicit exception to the address check."""
        host = host.lower().strip("[]")
        wanted = {host, f"{host}:{port}", f"[{host}]:{port}"}
        return any(entry.lower() in wanted for entry in self.allowed_hosts)


def as_policy(policy: UrlPolicy | dict[str, Any] | None) -> UrlPolicy:
    """A policy from a config dict (a one-line error naming the bad field), or the default."""
    if policy is None:
        return UrlPolicy()
    if isinstance(policy, UrlPolicy):
        return policy
    try:
        return msgspec.convert(policy, UrlPolicy)
    except msgspec.ValidationError as exc:
        raise ValueError(f"invalid url policy: {exc}") from exc


def address_kind(address: IPAddress) -> str | None:
    """Why `address` must not be fetched ("loopback", "private"...), or None if it is public."""
    embedded = _embedded_ipv4(address)
    if embedded is not None:
        return address_kind(embedded)
    if address in _NAT64_LOCAL:
        return "private"
    if address.is_global and not address.is_multicast:
        return None
    for kind, flag in (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("unique-local", address in _UNIQUE_LOCAL),
        ("private", address.is_private),
        ("reserved", address.is_reserved),
    ):
        if flag:
            return kind
    return "non-public"


def _embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv4-mapped, -compatible or -translated, 6to4 or NAT64 IPv6 address
    really reaches."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    last_32_bits = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address in _NAT64 or address in _IPV4_TRANSLATED:
        return last_32_bits
    # `::` and `::1` are IPv6's own unspecified and loopback addresses, not IPv4-compatible ones.
    if address in _IPV4_COMPATIBLE and int(address) > 1:
        return last_32_bits
    return None


def _split(url: str) -> tuple[str, int]:
    """Host and port of an http(s) URL, or a `ToolError` saying why it is refused."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as exc:
        raise ToolError(f"refused: {url!r} is not a valid URL ({exc})") from exc
    scheme = parsed.scheme.lower()
    if not scheme:
        raise ToolError(f"refused: {url!r} is not an absolute http(s) URL")
    if scheme not in ("http", "https"):
        raise ToolError(f"refused: {scheme}:// URLs are not fetched")
    if parsed.userinfo:
        raise ToolError("refused: URLs with credentials (user:password@) are not fetched")
    if not parsed.host:
        raise ToolError(f"refused: {url!r} has no host")
    return parsed.host, parsed.port or (443 if scheme == "https" else 80)


async def resolve_checked(host: str, port: int, policy: UrlPolicy) -> list[str]:
    """Every address `host` resolves to, once each has passed the policy (else `ToolError`)."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ToolError(f"cannot resolve host {host}: {exc}") from exc
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not (policy.allow_private or policy.allows_host(host, port)):
        _refuse_non_public(host, addresses)
    return addresses


def _refuse_non_public(host: str, addresses: Iterable[str]) -> None:
    literal = _ip_literal(host)
    for text in addresses:
        # Scoped IPv6 addresses come back as "fe80::1%eth0"; the scope is not part of the address.
        kind = address_kind(ipaddress.ip_address(text.split("%", 1)[0]))
        if kind is None:
            continue
        if literal is not None:
            article = "an" if kind == "unspecified" else "a"  # the only kind said with "an"
            raise ToolError(f"refused: {host} is {article} {kind} address")
        raise ToolError(f"refused: host {host} resolves to {kind} address {text}")


def _ip_literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


async def check_url(url: str, policy: UrlPolicy) -> None:
    """Raise `ToolError` with a one-line reason unless `url` is a public http(s) URL.

    Only http and https, no `user:password@`, and every address the host resolves to must be
    public unless the policy allows private addresses or names the host in `allowed_hosts`.
    """
    host, port = _split(url)
    await resolve_checked(host, port, policy)


class _PinnedBackend(httpcore.AsyncNetworkBackend):
    """Connects only to addresses that passed the policy, resolving each host exactly once."""

    def __init__(self, policy: UrlPolicy) -> None:
        self._policy = policy
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        last_error: Exception | None = None
        for address in await resolve_checked(host, port, self._policy):
            try:
                return await self._inner.connect_tcp(
                    address, port, timeout, local_address, socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last_error = exc
        raise last_error or httpcore.ConnectError(f"no address for {host}")

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise ToolError("refused: unix sockets are not fetched")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class PinnedTransport(httpx.AsyncHTTPTransport):
    """An httpx transport whose connections go only to addresses `policy` allows (no proxies)."""

    def __init__(self, policy: UrlPolicy) -> None:
        super().__init__()
        # httpx has no public hook for the network backend, so the pool it built is replaced by
        # one with httpx's default limits and our backend; request mapping and errors are unchanged.
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=100,
            max_keepalive_connections=20,
            keepalive_expiry=5.0,
            network_backend=_PinnedBackend(policy),
        )
