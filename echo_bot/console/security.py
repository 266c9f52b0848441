"""What every console response and form keeps to: strict headers, same-origin forms,
rate limits and the only redirect targets a sign-in may name."""

from __future__ import annotations

import hmac
import ipaddress
import re
import time
from collections import OrderedDict, deque
from urllib.parse import urlsplit

from aiohttp import web

# No inline script or style anywhere, nothing from elsewhere, no framing, no forms to
# other sites; the live queue's EventSource is same-origin.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    # same-origin: the console's own form posts carry a real Origin (with no-referrer
    # they said "null", which only Sec-Fetch-Site could vouch for, and Safari before
    # 16.4 sends none); another site is never told a console address.
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=(), payment=()",
}
# Where a sign-in may send the browser afterwards: a console page, nothing else.
_NEXT = re.compile(r"^/console/[A-Za-z0-9_\-/]{0,200}$")
# Keys a rate limit remembers at most (the oldest are forgotten first).
MAX_KEYS = 4096


def secure(response: web.StreamResponse) -> web.StreamResponse:
    if response.prepared:  # a stream: its headers went out when it was prepared
        return response
    for name, value in HEADERS.items():
        response.headers.setdefault(name, value)
    return response


def safe_next(target: str | None) -> str:
    """The page to go to after signing in: ``target`` if it is a console page, else the
    queue. Never another site, a protocol-relative URL or a path that climbs out."""
    if target and _NEXT.match(target) and "//" not in target and "/../" not in target + "/":
        return target
    return "/console/"


def same_origin(request: web.Request, public_url: str | None) -> bool:
    """Whether a form post comes from the console's own pages: the browser's
    ``Sec-Fetch-Site`` (when sent) says same-origin, and ``Origin`` (when sent) is this
    server as the browser reached it (its Host) or ``[console] public_url``."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    if origin == "null":
        # A page under ``Referrer-Policy: no-referrer`` (the console's before) made the
        # browser send ``Origin: null`` on its own form posts; the browser's
        # Sec-Fetch-Site, which no page can set, still tells ours from others'.
        return site == "same-origin"
    ours = {request.host.lower()}
    if public_url:
        ours.add(urlsplit(public_url).netloc.lower())
    try:
        netloc = urlsplit(origin).netloc.lower()
    except ValueError:  # "http://[::1": not a URL, so not ours (never a 500)
        return False
    return netloc in ours


def tokens_match(given: str | None, expected: str) -> bool:
    return bool(given) and hmac.compare_digest(
        str(given).encode("utf-8", "surrogateescape"), expected.encode()
    )


def peer_key(address: str | None) -> str:
    """Who a limit counts: the address, or for IPv6 its /64 (one host often has all of
    it, one address per request if it likes)."""
    try:
        ip = ipaddress.ip_address(address or "")
    except ValueError:
        return address or "?"
    if ip.version == 6:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class RateLimit:
    """At most ``per_minute`` events per key in any 60 s (a sliding window)."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()

    def allow(self, key: str, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        seen = self._seen.pop(key, None) or deque()
        while seen and seen[0] <= now - 60:
            seen.popleft()
        self._seen[key] = seen
        while len(self._seen) > MAX_KEYS:
            self._seen.popitem(last=False)
        if len(seen) >= self.per_minute:
            return False
        seen.append(now)
        return True

    def retry_after(self, key: str, now: float | None = None) -> int:
        now = time.monotonic() if now is None else now
        seen = self._seen.get(key)
        if not seen:
            return 1
        return max(1, int(seen[0] + 60 - now) + 1)
