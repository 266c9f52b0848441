"""http_request: one HTTP(S) request to an allowlisted host.

aiohttp is imported inside ``run`` only: the daemon must not load it unless a request
is actually made. The host is checked before anything touches the network, twice: with
the stdlib parser (cheap, no import) and with yarl, whose reading of the URL is the one
aiohttp connects to. The address actually connected to is checked too, at connect time
(see ``web_guard``): an allowlisted name may still point at a loopback or private
service.

A request is read risk only when it can carry nothing but the URL: GET or HEAD, no
body, and only headers from ``READ_SAFE_HEADERS``. Anything else can send data away
and asks for approval like any write. Headers that steer where or how the request is
delivered (``Host``, hop-by-hop and proxy/forwarding headers) are never sent.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

from ...config import HttpToolConfig
from ..base import ErrorCode, Risk, Tool, ToolContext, ToolGroup, ToolResult

if TYPE_CHECKING:
    from yarl import URL

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
READ_METHODS = frozenset({"GET", "HEAD"})
# Headers that only shape how a resource is read; every other header (Authorization,
# Cookie, X-anything) may carry data out and makes the request write risk.
READ_SAFE_HEADERS = frozenset({"accept", "accept-language", "if-none-match", "if-modified-since"})
# Headers that would override where or how the request is delivered.
STEERING_HEADERS = frozenset(
    {
        "host",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "expect",
        "forwarded",
        "x-real-ip",
        "x-host",
        "x-original-url",
        "x-rewrite-url",
        "x-http-method",
        "x-http-method-override",
        "x-method-override",
    }
)
STEERING_PREFIXES = ("proxy-", "x-forwarded-")
SHOWN_HEADERS = ("Content-Type", "Content-Length", "Location", "Last-Modified", "ETag")
_CHUNK = 64 * 1024
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_BAD_URL_CHARS = re.compile(r"[\x00-\x20\x7f\\]")


def _normal_host(host: str) -> str:
    host = host.strip().strip("[]").rstrip(".").lower()
    with suppress(ValueError):  # one spelling per IP address (yarl writes them compressed)
        return ipaddress.ip_address(host).compressed
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError:
        return host


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def host_allowed(host: str | None, allow_domains: Iterable[str]) -> bool:
    """``host`` equals an allowlisted domain or is a subdomain of one (not for IPs)."""
    if not host:
        return False
    host = _normal_host(host)
    for entry in allow_domains:
        domain = _normal_host(entry.strip().removeprefix("*."))
        if not domain:
            continue
        if host == domain or (not _is_ip(domain) and host.endswith("." + domain)):
            return True
    return False


class HttpRequestTool(Tool):
    name: ClassVar[str] = "http_request"
    description: ClassVar[str] = (
        "Make one HTTP or HTTPS request to an allowlisted host and return the status and "
        "body. Redirects are reported, not followed. A GET or HEAD without a body and with "
        "no headers other than Accept, Accept-Language, If-None-Match and If-Modified-Since "
        "runs without approval; anything else waits for the owner's approval. Host, "
        "hop-by-hop, proxy and forwarding headers cannot be set."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "url": {"type": "string", "minLength": 1, "maxLength": 8192},
            "method": {"type": "string", "enum": list(METHODS), "default": "GET"},
            "headers": {
                "type": "object",
                "additionalProperties": {"type": "string", "maxLength": 8192},
                "maxProperties": 20,
            },
            "body": {"type": "string", "maxLength": 100_000},
        },
        "required": ["url"],
        "additionalProperties": False,
    }
    key_args: ClassVar[tuple[str, ...]] = ("method", "url")
    risk: ClassVar[Risk] = Risk.WRITE
    group: ClassVar[ToolGroup] = "coding"

    def __init__(self, config: HttpToolConfig) -> None:
        self.config = config
        self.timeout = config.timeout.total_seconds() + 5  # type: ignore[misc]

    def available(self) -> bool:
        # With no allowed domain every request would be refused.
        return bool(self.config.allow_domains)

    def grant_scope(self, args: dict[str, Any], ctx: ToolContext) -> str:
        """A grant covers one method to one host (and port), the URL's other parts free."""
        method = str(args.get("method") or "GET").upper()
        try:
            parts = urlsplit(str(args.get("url", "")))
            host = (parts.hostname or "").rstrip(".")
            port = f":{parts.port}" if parts.port is not None else ""
        except ValueError:
            return f"{method} {args.get('url')}"
        return f"{method} {parts.scheme.lower()}://{host}{port}"

    def risk_for(self, args: dict[str, Any]) -> Risk:
        method = str(args.get("method") or "GET").upper()
        if method not in READ_METHODS or args.get("body") is not None:
            return Risk.WRITE
        headers = args.get("headers") or {}
        if not isinstance(headers, dict):
            return Risk.WRITE
        safe = all(str(name).lower() in READ_SAFE_HEADERS for name in headers)
        return Risk.READ if safe else Risk.WRITE

    def check_url(self, url: str) -> ToolResult | None:
        """None when ``url`` may be requested, else the refusal (no network involved)."""
        if _BAD_URL_CHARS.search(url):
            return ToolResult.failure(
                ErrorCode.INVALID_PARAMETER, "the URL contains spaces, control characters or '\\'"
            )
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError for a bad port
        except ValueError as exc:
            return ToolResult.failure(ErrorCode.INVALID_PARAMETER, f"invalid URL: {exc}")
        if parts.scheme.lower() not in ("http", "https"):
            return ToolResult.failure(
                ErrorCode.INVALID_PARAMETER, "only http:// and https:// URLs are supported"
            )
        if parts.username is not None or parts.password is not None:
            return ToolResult.failure(
                ErrorCode.INVALID_PARAMETER,
                "credentials in the URL are not allowed; send an Authorization header",
            )
        return self._check_host(parts.hostname)

    def _check_host(self, host: str | None) -> ToolResult | None:
        if not host:
            return ToolResult.failure(ErrorCode.INVALID_PARAMETER, "the URL has no host")
        if host_allowed(host, self.config.allow_domains):
            return None
        allowed = ", ".join(self.config.allow_domains) or "none"
        return ToolResult.failure(
            ErrorCode.PERMISSION_DENIED,
            f"the host {host} is not in tools.http.allow_domains (allowed: {allowed})",
            host=host,
        )

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        method = str(args.get("method") or "GET").upper()
        headers = dict(args.get("headers") or {})
        target = self._target(str(args["url"]), headers)
        if isinstance(target, ToolResult):
            return target
        fetched = await self._fetch(method, target, headers, args.get("body"))
        if isinstance(fetched, ToolResult):
            return fetched
        return self._answer(fetched)

    def _target(self, url: str, headers: dict[str, Any]) -> URL | ToolResult:
        """The URL to request (a yarl URL), or why not: checked as written, then as
        aiohttp will send it (its host decides, not the text's)."""
        refused = self.check_url(url) or _check_headers(headers)
        if refused is not None:
            return refused
        from yarl import URL  # lazily, with aiohttp: see the module docstring

        try:
            target = URL(url)
        except (ValueError, TypeError) as exc:
            return ToolResult.failure(ErrorCode.INVALID_PARAMETER, f"invalid URL: {exc}")
        if target.scheme not in ("http", "https"):
            return ToolResult.failure(
                ErrorCode.INVALID_PARAMETER, "only http:// and https:// URLs are supported"
            )
        return self._check_host(target.host) or target

    async def _fetch(
        self, method: str, target: URL, headers: dict[str, Any], body: Any
    ) -> _Fetched | ToolResult:
        import aiohttp  # lazily: see the module docstring

        seconds = self.config.timeout.total_seconds()
        connector, resolver = self._connector()
        try:
            async with (
                aiohttp.ClientSession(
                    connector=connector,
                    timeout=aiohttp.ClientTimeout(total=seconds),
                    trust_env=False,
                    cookie_jar=aiohttp.DummyCookieJar(),
                ) as session,
                session.request(
                    method, target, headers=headers, data=body, allow_redirects=False
                ) as response,
            ):
                content, truncated = b"", False
                if method != "HEAD":
                    content, truncated = await _read_limited(response, self.config.max_bytes)
                return _Fetched(
                    status=response.status,
                    reason=response.reason or "",
                    headers={
                        k: response.headers[k] for k in SHOWN_HEADERS if k in response.headers
                    },
                    charset=response.charset,
                    content_type=response.content_type,
                    content=content,
                    truncated=truncated,
                )
        except TimeoutError:
            return ToolResult.failure(
                ErrorCode.TIMEOUT, f"{method} {target.host}: no answer within {seconds:g} s"
            )
        except (aiohttp.ClientError, ValueError) as exc:
            return _failure(exc, f"{method} {target.host}", target.host)
        finally:
            if resolver is not None:
                await resolver.close()

    def _answer(self, fetched: _Fetched) -> ToolResult:
        status, shown = fetched.status, fetched.headers
        data = {"status": status, "headers": shown, "truncated": fetched.truncated}
        try:
            text = _body_text(fetched.content, fetched.charset, fetched.content_type)
        except (LookupError, UnicodeError):
            return ToolResult.failure(
                ErrorCode.UPSTREAM_ERROR,
                f"HTTP {status}: the response declares charset {fetched.charset!r:.80}, which "
                "is not a text encoding; the body was not decoded",
                **data,
            )
        lines = [f"HTTP {status} {fetched.reason}".rstrip()]
        if "Location" in shown:
            lines.append(f"Location: {shown['Location']} (redirects are not followed)")
        if text:
            lines.append(text)
        if fetched.truncated:
            lines.append(f"[body truncated after {self.config.max_bytes} bytes]")
        output = "\n".join(lines)
        if status >= 500:
            return ToolResult.failure(ErrorCode.UPSTREAM_ERROR, output, **data)
        return ToolResult(ok=status < 400, output=output, data=data)

    def _connector(self) -> tuple[Any, Any]:
        """The connector, and the resolver to close after it (None: nothing to close)."""
        import aiohttp

        if self.config.allow_private:
            return aiohttp.TCPConnector(), None
        from .web_guard import PublicResolver, guarded_socket

        resolver = PublicResolver()
        connector = aiohttp.TCPConnector(
            resolver=resolver, socket_factory=guarded_socket, use_dns_cache=False
        )
        return connector, resolver


def _check_headers(headers: dict[str, str]) -> ToolResult | None:
    for name, value in headers.items():
        if not _HEADER_NAME.match(name) or any(c in value for c in "\r\n\0"):
            return ToolResult.failure(ErrorCode.INVALID_PARAMETER, f"invalid header {name!r}")
        lowered = name.lower()
        if lowered in STEERING_HEADERS or lowered.startswith(STEERING_PREFIXES):
            return ToolResult.failure(
                ErrorCode.INVALID_PARAMETER,
                f"the header {name!r} cannot be set: it would change where or how the "
                "request is delivered",
            )
    return None


async def _read_limited(response: Any, limit: int) -> tuple[bytes, bool]:
    """At most ``limit`` bytes of the body; reading stops as soon as there is more."""
    buffer = bytearray()
    while len(buffer) <= limit:
        chunk = await response.content.read(min(_CHUNK, limit + 1 - len(buffer)))
        if not chunk:
            break
        buffer += chunk
    return bytes(buffer[:limit]), len(buffer) > limit


def _body_text(content: bytes, charset: str | None, content_type: str) -> str:
    """The body as text. Raises LookupError for a charset that is not a text encoding.

    ``bytes.decode`` itself refuses codecs that are not text encodings (rot13, base64,
    zlib ...) with LookupError, as it does unknown names; those are not guessed around.
    """
    if not content:
        return ""
    if b"\0" in content:
        return f"[{len(content)} bytes of binary content ({content_type})]"
    return content.decode(charset or "utf-8", errors="replace")


@dataclass(frozen=True, slots=True)
class _Fetched:
    """A response, read (up to the byte cap) before its connection closed."""

    status: int
    reason: str
    headers: dict[str, str]
    charset: str | None
    content_type: str
    content: bytes
    truncated: bool


def _failure(exc: Exception, request: str, host: str | None) -> ToolResult:
    """A request that got no response, in the words a model can act on."""
    import aiohttp

    from .web_guard import AddressRefused

    if isinstance(exc, aiohttp.InvalidURL):
        return ToolResult.failure(ErrorCode.INVALID_PARAMETER, f"invalid URL: {exc}")
    if isinstance(exc, aiohttp.ClientConnectorError) and isinstance(exc.os_error, AddressRefused):
        return ToolResult.failure(
            ErrorCode.PERMISSION_DENIED,
            f"{request} refused: {exc.os_error.strerror}",
            host=host,
        )
    if isinstance(exc, aiohttp.ClientError):
        return ToolResult.failure(
            ErrorCode.UPSTREAM_ERROR, f"{request} failed: {type(exc).__name__}: {exc}"
        )
    # A ValueError: e.g. a header aiohttp will not send.
    return ToolResult.failure(ErrorCode.INVALID_PARAMETER, f"cannot send that: {exc}")
