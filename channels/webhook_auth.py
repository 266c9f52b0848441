"""Verifying incoming webhook requests: GitHub, Standard Webhooks, bearer tokens.

Every comparison is constant-time. A verifier returns None when the request is
authentic, else the (status, reason) to answer with — reasons never echo secrets.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Callable, Mapping

STANDARD_TOLERANCE = 300  # seconds, as the Standard Webhooks spec says

Failure = tuple[int, str]


def _raw(text: str) -> bytes:
    """A header value's bytes (aiohttp keeps undecodable bytes as lone surrogates)."""
    return text.encode("utf-8", "surrogateescape")


def github_signature(secret: str, body: bytes) -> str:
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def verify_github(secret: str, headers: Mapping[str, str], body: bytes) -> Failure | None:
    given = headers.get("X-Hub-Signature-256", "")
    if not given:
        return 401, "missing X-Hub-Signature-256"
    expected = github_signature(secret, body)
    if not hmac.compare_digest(_raw(given.strip()), expected.encode()):
        return 401, "bad signature"
    return None


def verify_bearer(secret: str, headers: Mapping[str, str], body: bytes) -> Failure | None:
    given = headers.get("Authorization", "")
    scheme, _, token = given.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return 401, "missing bearer token"
    if not hmac.compare_digest(_raw(token.strip()), secret.encode()):
        return 401, "bad bearer token"
    return None


def standard_key(secret: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret (``whsec_`` + base64)."""
    raw = secret.removeprefix("whsec_")
    try:  # senders often drop the base64 padding; the reference library accepts that
        return base64.b64decode(raw + "=" * (-len(raw) % 4), validate=True)
    except (binascii.Error, ValueError):
        return secret.encode()  # not base64: use the text itself


def standard_signature(secret: str, msg_id: str, timestamp: str, body: bytes) -> str:
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(standard_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def verify_standard(
    secret: str,
    headers: Mapping[str, str],
    body: bytes,
    clock: Callable[[], float] = time.time,
) -> Failure | None:
    msg_id = headers.get("webhook-id", "")
    stamp = headers.get("webhook-timestamp", "")
    signatures = headers.get("webhook-signature", "")
    if not msg_id or not stamp or not signatures:
        return 401, "missing webhook-id, webhook-timestamp or webhook-signature"
    if (
        len(msg_id) > 256
        or not msg_id.isprintable()
        or not stamp.isascii()
        or not stamp.isdigit()
        or len(stamp) > 12
    ):
        return 400, "malformed webhook-id or webhook-timestamp"
    if abs(clock() - int(stamp)) > STANDARD_TOLERANCE:
        return 400, "webhook-timestamp is outside the 5-minute tolerance"
    expected = standard_signature(secret, msg_id, stamp, body).encode()
    for candidate in signatures.split()[:10]:
        if candidate.startswith("v1,") and hmac.compare_digest(_raw(candidate), expected):
            return None
    return 401, "bad signature"


def verify(auth: str, secret: str, headers: Mapping[str, str], body: bytes) -> Failure | None:
    if auth == "github":
        return verify_github(secret, headers, body)
    if auth == "standard":
        return verify_standard(secret, headers, body)
    if auth == "bearer":
        return verify_bearer(secret, headers, body)
    return None  # "none": allowed only with allow_unauthenticated (checked in config)
