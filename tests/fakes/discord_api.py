"""A fake Discord at the HTTP and WebSocket boundary, which the real discord.py talks to.

discord.py reaches Discord at fixed addresses (``https://discord.com/api/v10``, the
gateway at ``wss://gateway.discord.gg``), so the fake stands where a TLS-intercepting
HTTP proxy would: the client is given ``proxy=fake.proxy_url`` and a connector that
trusts ``fake.ca_file`` (the CA of a certificate the fake makes for Discord's names).
Each CONNECT is answered, its TLS ended here, and its bytes pumped to an aiohttp app on
127.0.0.1 that serves the REST API and the gateway.

The gateway: HELLO, IDENTIFY (the token and intents checked, READY with a session),
heartbeats (ACKed), RESUME (the events after the client's sequence sent again, then
RESUMED; an unknown session is answered INVALID_SESSION), dispatches with sequence
numbers. ``drop_gateway()`` cuts the connection (the client RESUMEs), ``invalidate()``
ends the session (the client IDENTIFYs anew). The REST API: the bot's user, DM channels,
messages posted (JSON or multipart with files) and edited, interaction callbacks, and a
429 on demand (``rate_limit_next``) with ``retry_after`` and the bucket headers. Every
call is recorded in ``calls``; messages the bot posted in ``sent``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import ssl
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from aiohttp import WSMsgType, web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

HOSTS = ("discord.com", "gateway.discord.gg", "cdn.discordapp.com")
TOKEN = "MTAx.fake-bot.token"
BOT_ID = "1000000000000000001"
OWNER_ID = "1100000000000000001"
MESSAGE_CONTENT = 1 << 15  # the privileged intent
APP_ID = "1000000000000000002"
BOT_USER = {"id": BOT_ID, "username": "echo-bot", "discriminator": "0",
            "global_name": "echo-bot", "avatar": None, "bot": True}  # fmt: skip
DISCORD_EPOCH_MS = 1_420_070_400_000
_last = [0]


def snowflake() -> str:
    """A new ID as Discord makes them: the time in its top bits (a catch-up bounded by
    age reads it), always greater than the last one."""
    made = max(_last[0] + 1, (int(time.time() * 1000) - DISCORD_EPOCH_MS) << 22)
    _last[0] = made
    return str(made)


def user(user_id: str, name: str) -> dict[str, Any]:
    return {"id": user_id, "username": name, "discriminator": "0", "global_name": name,
            "avatar": None}  # fmt: skip


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


def _certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA, and a certificate for Discord's names signed by it: (ca, cert, key)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake Discord CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOSTS[0])]))
        .issuer_name(ca_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in HOSTS]),
                       critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    paths = folder / "ca.pem", folder / "cert.pem", folder / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))  # fmt: skip
    return paths


@dataclass
class Call:
    method: str
    path: str
    status: int
    body: Any = None


@dataclass
class Sent:
    id: str
    channel_id: str
    content: str
    components: list[Any] = field(default_factory=list)
    files: list[tuple[str, bytes]] = field(default_factory=list)
    edits: list[str] = field(default_factory=list)
    nonce: str | None = None
    reference: str | None = None
    allowed_mentions: Any = None
    flags: int = 0
    deleted: bool = False


@dataclass
class Session:
    id: str
    intents: int
    seq: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)


class FakeDiscord:
    HEARTBEAT_MS = 41_250

    def __init__(self, token: str = TOKEN) -> None:
        self.token = token
        self.calls: list[Call] = []
        self.sent: list[Sent] = []
        self.sessions: dict[str, Session] = {}
        self.session: Session | None = None  # the gateway's current session
        self.identified = 0
        self.identify_tries = 0  # refused ones too
        self.resumed = 0
        self.connected = asyncio.Event()
        self._ws: web.WebSocketResponse | None = None
        self._limits: dict[str, list[tuple[float, bool]]] = {}
        self.history: dict[str, list[dict[str, Any]]] = {}  # channel → its messages
        self.guilds: list[dict[str, Any]] = []
        self.files: dict[str, bytes] = {}  # CDN path → bytes
        self.downloads: list[str] = []  # CDN paths fetched
        self.refused: list[list[str]] = []  # payloads refused as Discord would (400)
        self.callbacks: list[tuple[str, dict[str, Any]]] = []  # (interaction id, body)
        self.fail_status: dict[str, list[int]] = {}
        self.lose_answers = 0  # posts made, then answered 500 (the answer lost on the way)
        self.history_reads = 0
        self.cloudflare_bans = 0  # calls answered as Cloudflare bans: 429 without ``Via``
        self.banned_posts: list[bool] = []  # the next message posts: True, one banned so
        self.nonces_kept = True  # False: a repeated nonce past Discord's window (minutes)
        self.upload_limit = 10 * 1024**2  # bytes of files in one message (a bot's, unboosted)
        self.app_flags = 1 << 19  # the application's flags: Message Content (limited) on
        self.history_delay = 0.0  # seconds each history read takes to answer
        self.post_limit: tuple[int, float] | None = None  # (posts, seconds) per channel
        self._windows: dict[str, tuple[float, int]] = {}  # channel → (window start, posts)
        self._folder = Path(tempfile.mkdtemp(prefix="fake-discord-"))
        self.ca_file, cert, key = _certificates(self._folder)
        self._tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._tls.load_cert_chain(cert, key)
        self._runner: web.AppRunner | None = None
        self._proxy: asyncio.Server | None = None
        self._backend = 0
        self.proxy_url = ""
        self._pumps: set[asyncio.Task[None]] = set()

    # -- lifecycle ------------------------------------------------------------------------
    async def __aenter__(self) -> Self:
        app = web.Application(client_max_size=64 * 1024**2)
        app.router.add_get("/", self._gateway)
        app.router.add_get("/attachments/{path:.*}", self._cdn)
        app.router.add_route("*", "/api/v10/{path:.*}", self._rest)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self._backend = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._proxy = await asyncio.start_server(self._connect, "127.0.0.1", 0)
        self.proxy_url = f"http://127.0.0.1:{self._proxy.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:  # fmt: skip
        if self._proxy is not None:
            self._proxy.close()
        for pump in list(self._pumps):
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        if self._ws is not None:
            await self._ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    # -- the proxy: CONNECT, TLS ended here, bytes to the app ----------------------------
    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._pumps.add(task)
        try:
            request = (await reader.readline()).decode().split()
            while (await reader.readline()).strip():
                pass
            host = request[1].rsplit(":", 1)[0] if len(request) == 3 else ""
            if request[:1] != ["CONNECT"] or host not in HOSTS:
                writer.write(b"HTTP/1.1 403 Forbidden\r\n\r\n")
                return
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            await writer.start_tls(self._tls)
            back_reader, back_writer = await asyncio.open_connection("127.0.0.1", self._backend)
            await asyncio.gather(_pump(reader, back_writer), _pump(back_reader, writer))
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client gone, or the fake closing
        finally:
            self._pumps.discard(task)
            writer.close()

    # -- the gateway ----------------------------------------------------------------------
    async def _gateway(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        self._ws = ws
        await ws.send_json({"op": 10, "d": {"heartbeat_interval": self.HEARTBEAT_MS},
                            "s": None, "t": None})  # fmt: skip
        async for message in ws:
            if message.type != WSMsgType.TEXT:
                continue
            payload = json.loads(message.data)
            op, data = payload.get("op"), payload.get("d")
            if op == 1:
                await ws.send_json({"op": 11, "d": None, "s": None, "t": None})
            elif op == 2:
                await self._identify(ws, data)
            elif op == 6:
                await self._resume(ws, data)
        if self._ws is ws:
            self._ws = None
            self.connected.clear()
        return ws

    async def _identify(self, ws: web.WebSocketResponse, data: dict[str, Any]) -> None:
        self.identify_tries += 1
        if data.get("token") != self.token:
            await ws.close(code=4004, message=b"Authentication failed.")
            return
        intents = int(data.get("intents") or 0)
        if intents & MESSAGE_CONTENT and not self.app_flags & (1 << 18 | 1 << 19):
            await ws.close(code=4014, message=b"Disallowed intent(s).")
            return
        session = Session(id=snowflake(), intents=intents)
        self.sessions[session.id] = self.session = session
        self.identified += 1
        unavailable = [{"id": g["id"], "unavailable": True} for g in self.guilds]
        ready = {"v": 10, "user": BOT_USER, "guilds": unavailable, "session_id": session.id,
                 "resume_gateway_url": "wss://gateway.discord.gg", "shard": [0, 1],
                 "application": {"id": APP_ID, "flags": 0}}  # fmt: skip
        await self._send(ws, session, "READY", ready)
        for guild in self.guilds:
            await self._send(ws, session, "GUILD_CREATE", guild)
        self.connected.set()

    async def _resume(self, ws: web.WebSocketResponse, data: dict[str, Any]) -> None:
        session = self.sessions.get(str(data.get("session_id")))
        if session is None or data.get("token") != self.token:
            await ws.send_json({"op": 9, "d": False, "s": None, "t": None})
            return
        self.session = session
        self.resumed += 1
        after = int(data.get("seq") or 0)
        for event in session.events:
            if event["s"] > after:
                await ws.send_json(event)
        await self._send(ws, session, "RESUMED", {})
        self.connected.set()

    async def _send(
        self, ws: web.WebSocketResponse | None, session: Session, kind: str, data: Any
    ) -> None:
        session.seq += 1
        event = {"op": 0, "s": session.seq, "t": kind, "d": data}
        session.events.append(event)
        if ws is not None and not ws.closed:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await ws.send_json(event)

    async def dispatch(self, kind: str, data: dict[str, Any]) -> None:
        """An event in the current session: sent now if the bot is connected, else
        kept for its RESUME."""
        assert self.session is not None, "no session: the bot never identified"
        await self._send(self._ws, self.session, kind, data)

    async def drop_gateway(self) -> None:
        """The connection cut (not a clean close): the client comes back and RESUMEs."""
        ws, self._ws = self._ws, None
        self.connected.clear()
        if ws is not None:
            await ws.close(code=4000, message=b"Unknown error.")

    async def invalidate(self) -> None:
        """The session ended on Discord's side: the client IDENTIFYs anew."""
        if self.session is not None:
            self.sessions.pop(self.session.id, None)
        if self._ws is not None:
            await self._ws.send_json({"op": 9, "d": False, "s": None, "t": None})

    async def push_message(
        self, content: str, *, author: dict[str, Any], channel_id: str,
        guild_id: str | None = None, mentions: list[dict[str, Any]] | None = None,
        roles: list[str] | None = None,
        message_id: str | None = None, attachments: list[dict[str, Any]] | None = None,
        reply_to: dict[str, Any] | None = None, dispatch: bool = True,
    ) -> dict[str, Any]:  # fmt: skip
        """A MESSAGE_CREATE from ``author`` in ``channel_id``: the message (``dispatch``
        False: only kept, as one sent while the bot's session was gone)."""
        message = {
            "id": message_id or snowflake(), "channel_id": channel_id, "author": author,
            "content": content, "timestamp": _now(), "edited_timestamp": None,
            "tts": False, "mention_everyone": False, "mentions": mentions or [],
            "mention_roles": roles or [], "attachments": [], "embeds": [], "pinned": False,
            "type": 0, "flags": 0, "components": [],
        }  # fmt: skip
        if attachments:
            message["attachments"] = attachments
        if reply_to is not None:
            message["type"] = 19
            message["message_reference"] = {"message_id": reply_to["id"],
                                            "channel_id": channel_id}  # fmt: skip
            message["referenced_message"] = reply_to
        self.history.setdefault(channel_id, []).append(dict(message))
        if guild_id is not None:
            message["guild_id"] = guild_id
            message["member"] = {"roles": [], "joined_at": _now(), "deaf": False, "mute": False}
        if dispatch:
            await self.dispatch("MESSAGE_CREATE", message)
        return message

    def add_file(self, name: str, data: bytes, content_type: str = "text/plain") -> dict[str, Any]:
        """A file on the CDN: the attachment object a message carries for it."""
        path = f"{snowflake()}/{name}"
        self.files[path] = data
        url = f"https://cdn.discordapp.com/attachments/{path}?ex=1&is=1&hm=abc"
        return {"id": snowflake(), "filename": name, "size": len(data), "url": url,
                "proxy_url": url, "content_type": content_type}  # fmt: skip

    def add_guild(self, guild_id: str, channels: list[str],
                  threads: dict[str, str] | None = None,
                  categories: list[str] | None = None) -> None:  # fmt: skip
        """A guild the bot is in (sent as GUILD_CREATE after READY), its text channels,
        its threads (thread → parent channel) and its categories (holding no messages)."""
        self.guilds.append({
            "id": guild_id, "name": f"guild {guild_id}", "unavailable": False,
            "owner_id": OWNER_ID, "emojis": [], "features": [],
            # Its @everyone role, the bot's own managed role, and the bot as a member.
            "roles": [_role(guild_id, "@everyone"),
                      _role(bot_role(guild_id), "echo-bot", {"bot_id": BOT_ID})],
            "members": [{"user": BOT_USER, "roles": [bot_role(guild_id)], "joined_at": _now(),
                         "deaf": False, "mute": False, "flags": 0}],
            "member_count": 2, "large": False, "joined_at": _now(), "voice_states": [],
            "presences": [], "stage_instances": [], "guild_scheduled_events": [],
            "channels": [{"id": c, "type": 0, "name": f"channel-{c}", "guild_id": guild_id,
                          "position": n, "permission_overwrites": [], "nsfw": False,
                          "parent_id": None} for n, c in enumerate(channels)]
                        + [{"id": c, "type": 4, "name": f"category-{c}", "guild_id": guild_id,
                            "position": n, "permission_overwrites": [], "nsfw": False,
                            "parent_id": None} for n, c in enumerate(categories or [])],
            "threads": [{"id": t, "type": 11, "name": f"thread-{t}", "guild_id": guild_id,
                         "parent_id": p, "owner_id": OWNER_ID, "message_count": 1,
                         "member_count": 1, "rate_limit_per_user": 0,
                         "thread_metadata": {"archived": False, "auto_archive_duration": 1440,
                                             "archive_timestamp": _now(), "locked": False}}
                        for t, p in (threads or {}).items()],
        })  # fmt: skip

    async def press(self, sent: Sent, custom_id: str, *, by: dict[str, Any],
                    guild_id: str | None = None) -> str:  # fmt: skip
        """An INTERACTION_CREATE: ``by`` pressed the button ``custom_id`` on ``sent``;
        the interaction's id."""
        interaction_id = snowflake()
        data: dict[str, Any] = {
            "id": interaction_id, "application_id": APP_ID, "type": 3,
            "token": f"token-{interaction_id}", "version": 1,
            "channel_id": sent.channel_id, "channel": {"id": sent.channel_id, "type": 1},
            "message": self._message(sent), "data": {"custom_id": custom_id, "component_type": 2},
            "app_permissions": "0", "locale": "en-US", "entitlements": [],
            "attachment_size_limit": 10 * 1024**2,
            "authorizing_integration_owners": {}, "context": 1 if guild_id is None else 0,
        }  # fmt: skip
        if guild_id is None:
            data["user"] = by
        else:
            data["guild_id"] = guild_id
            data["member"] = {"user": by, "roles": [], "joined_at": _now(), "deaf": False,
                              "mute": False, "permissions": "0"}  # fmt: skip
        await self.dispatch("INTERACTION_CREATE", data)
        return interaction_id

    # -- REST -----------------------------------------------------------------------------
    def rate_limit_next(self, route: str, retry_after: float = 1.0, *, glob: bool = False) -> None:
        """The next call to ``route`` ("POST /channels/{id}/messages", ids written as
        ``{id}``) answered 429."""
        self._limits.setdefault(route, []).append((retry_after, glob))

    def limit_posts(self, posts: int = 5, seconds: float = 5.0) -> None:
        """Posting limited per channel as Discord does (5 per 5 s): each answer carries
        the bucket's headers, and a post past the limit is answered 429."""
        self.post_limit = (posts, seconds)

    def _bucket(self, path: str) -> tuple[int, dict[str, str]]:
        """(429 or 0, the bucket's headers) of a post in a limited channel."""
        assert self.post_limit is not None
        posts, seconds = self.post_limit
        channel, now = path.split("/")[2], time.monotonic()
        start, count = self._windows.get(channel, (now, 0))
        if now - start >= seconds:
            start, count = now, 0
        reset = max(0.0, seconds - (now - start))
        headers = {"X-RateLimit-Limit": str(posts), "X-RateLimit-Reset-After": f"{reset:.3f}",
                   "X-RateLimit-Bucket": f"post-{channel}", "X-RateLimit-Reset":
                   f"{time.time() + reset:.3f}"}  # fmt: skip
        if count >= posts:
            return 429, {**headers, "X-RateLimit-Remaining": "0", "Retry-After": f"{reset:.3f}",
                         "X-RateLimit-Scope": "user"}  # fmt: skip
        self._windows[channel] = (start, count + 1)
        return 0, {**headers, "X-RateLimit-Remaining": str(posts - count - 1)}

    def fail_next(self, route: str, status: int) -> None:
        """The next call to ``route`` answered ``status`` (a 500, a 403…)."""
        self.fail_status.setdefault(route, []).append(status)

    def calls_to(self, route: str) -> list[Call]:
        return [c for c in self.calls if _route(c.method, c.path) == route]

    async def _rest(self, request: web.Request) -> web.StreamResponse:
        path = "/" + request.match_info["path"]
        route = _route(request.method, path)
        # An interaction's callback is authorised by its own token, in its path.
        interaction = route == "POST /interactions/{id}/{token}/callback"
        if not interaction and request.headers.get("Authorization") != f"Bot {self.token}":
            return self._answer(request, path, 401, {"message": "401: Unauthorized", "code": 0})
        banned = False
        if route == "POST /channels/{id}/messages" and self.banned_posts:
            banned = self.banned_posts.pop(0)
        if banned or self.cloudflare_bans:
            self.cloudflare_bans -= 0 if banned else 1
            self.calls.append(Call(request.method, path, 429, "error code: 1015"))
            return web.Response(status=429, text="error code: 1015")
        failing = self.fail_status.get(route)
        if failing:
            status = failing.pop(0)
            return self._answer(request, path, status, {"message": "failed", "code": 0})
        waiting = self._limits.get(route)
        if waiting:
            retry_after, glob = waiting.pop(0)
            body = {"message": "You are being rate limited.", "retry_after": retry_after,
                    "global": glob}  # fmt: skip
            headers = {"Retry-After": f"{retry_after:g}", "X-RateLimit-Limit": "5",
                       "X-RateLimit-Remaining": "0", "X-RateLimit-Reset-After": f"{retry_after:g}",
                       "X-RateLimit-Bucket": route.replace(" ", "-"),
                       "X-RateLimit-Scope": "global" if glob else "user"}  # fmt: skip
            if glob:
                headers["X-RateLimit-Global"] = "true"
            return self._answer(request, path, 429, body, headers)
        handler = {
            "GET /users/@me": self._me,
            "GET /gateway/bot": self._gateway_bot,
            "GET /oauth2/applications/@me": self._application,
            "POST /users/@me/channels": self._dm_channel,
            "POST /channels/{id}/messages": self._post_message,
            "PATCH /channels/{id}/messages/{id}": self._edit_message,
            "DELETE /channels/{id}/messages/{id}": self._delete_message,
            "GET /channels/{id}/messages": self._messages,
            "GET /channels/{id}": self._channel,
            "GET /users/@me/guilds": self._my_guilds,
            "POST /interactions/{id}/{token}/callback": self._callback,
        }.get(route)
        if handler is None:
            return self._answer(request, path, 404, {"message": "404: Not Found", "code": 0})
        bucket: dict[str, str] = {}
        if self.post_limit is not None and route == "POST /channels/{id}/messages":
            limited, bucket = self._bucket(path)
            if limited:
                retry = float(bucket["Retry-After"])
                body = {"message": "You are being rate limited.", "retry_after": retry,
                        "global": False}  # fmt: skip
                return self._answer(request, path, 429, body, bucket)
        status, body = await handler(request, path)
        return self._answer(request, path, status, body, bucket)

    def _answer(
        self, request: web.Request, path: str, status: int, body: Any,
        headers: dict[str, str] | None = None,
    ) -> web.Response:  # fmt: skip
        self.calls.append(Call(request.method, path, status, body))
        if status == 204:
            return web.Response(status=204, headers={**(headers or {}), "Via": "1.1 google"})
        # As Discord writes it: discord.py reads JSON only under exactly this type, and
        # takes a 429 without ``Via`` (Discord's load balancer) for Cloudflare's ban.
        headers = {**(headers or {}), "Content-Type": "application/json", "Via": "1.1 google"}
        return web.Response(body=json.dumps(body).encode(), status=status, headers=headers)

    async def _me(self, request: web.Request, path: str) -> tuple[int, Any]:
        return 200, BOT_USER

    async def _application(self, request: web.Request, path: str) -> tuple[int, Any]:
        return 200, {"id": APP_ID, "name": "echo-bot", "description": "", "icon": None,
                     "bot_public": False, "bot_require_code_grant": False,
                     "flags": self.app_flags,
                     "owner": user("1100000000000000001", "owner"), "verify_key": "00" * 32,
                     "team": None, "summary": "", "rpc_origins": []}  # fmt: skip

    async def _gateway_bot(self, request: web.Request, path: str) -> tuple[int, Any]:
        limit = {"total": 1000, "remaining": 999, "reset_after": 0, "max_concurrency": 1}
        return 200, {"url": "wss://gateway.discord.gg", "shards": 1,
                     "session_start_limit": limit}  # fmt: skip

    async def _dm_channel(self, request: web.Request, path: str) -> tuple[int, Any]:
        recipient = str((await request.json()).get("recipient_id"))
        return 200, {"id": dm_of(recipient), "type": 1, "recipients": [user(recipient, "someone")],
                     "last_message_id": None}  # fmt: skip

    async def _post_message(self, request: web.Request, path: str) -> tuple[int, Any]:
        channel_id = path.split("/")[2]
        payload, files = await _payload(request)
        if sum(len(data) for _, data in files) > self.upload_limit:
            return 413, {"message": "Request entity too large", "code": 40005}
        if problems := invalid(payload, len(files)):
            self.refused.append(problems)
            return 400, {"code": 50035, "message": "Invalid Form Body", "errors": problems}
        nonce = payload.get("nonce")
        if payload.get("enforce_nonce") and nonce is not None and self.nonces_kept:
            made = next((s for s in self.sent if s.nonce == str(nonce)), None)
            if made is not None:  # Discord answers a repeated nonce with the first message
                return 200, self._message(made)
        sent = Sent(snowflake(), channel_id, str(payload.get("content") or ""),
                    list(payload.get("components") or []), files,
                    nonce=None if nonce is None else str(nonce),
                    reference=(payload.get("message_reference") or {}).get("message_id"),
                    allowed_mentions=payload.get("allowed_mentions"),
                    flags=int(payload.get("flags") or 0))  # fmt: skip
        self.sent.append(sent)
        message = self._message(sent)
        self.history.setdefault(channel_id, []).append(message)
        if self.lose_answers:
            self.lose_answers -= 1
            return 500, {"message": "500: Internal Server Error", "code": 0}
        return 200, message

    async def _delete_message(self, request: web.Request, path: str) -> tuple[int, Any]:
        message_id = path.split("/")[-1]
        found = next((s for s in self.sent if s.id == message_id and not s.deleted), None)
        if found is None:
            return 404, {"message": "Unknown Message", "code": 10008}
        found.deleted = True
        return 204, None

    async def _messages(self, request: web.Request, path: str) -> tuple[int, Any]:
        """History, newest first as Discord gives it: the ``limit`` messages right after
        ``after``, or right before ``before`` (or the newest)."""
        channel_id = path.split("/")[2]
        await asyncio.sleep(self.history_delay)
        self.history_reads += 1
        limit = min(int(request.query.get("limit") or 50), 100)
        kept = self.history.get(channel_id, [])
        if "after" in request.query:
            newer = [m for m in kept if int(m["id"]) > int(request.query["after"])]
            return 200, list(reversed(newer[:limit]))
        before = int(request.query.get("before") or 1 << 63)
        return 200, list(reversed([m for m in kept if int(m["id"]) < before][-limit:]))

    async def _channel(self, request: web.Request, path: str) -> tuple[int, Any]:
        """A guild's channel or thread as Discord gives it (a DM's is not kept here)."""
        channel_id = path.split("/")[2]
        for guild in self.guilds:
            for channel in [*guild["channels"], *guild["threads"]]:
                if channel["id"] == channel_id:
                    return 200, channel
        return 404, {"message": "Unknown Channel", "code": 10003}

    async def _my_guilds(self, request: web.Request, path: str) -> tuple[int, Any]:
        return 200, [{"id": g["id"], "name": g["name"], "icon": None, "owner": False,
                      "permissions": "0", "features": []} for g in self.guilds]  # fmt: skip

    async def _cdn(self, request: web.Request) -> web.StreamResponse:
        self.downloads.append(request.match_info["path"])
        data = self.files.get(request.match_info["path"])
        if data is None:
            return web.Response(status=404)
        return web.Response(body=data, content_type="application/octet-stream")

    async def _edit_message(self, request: web.Request, path: str) -> tuple[int, Any]:
        message_id = path.split("/")[-1]
        payload, files = await _payload(request)
        if problems := invalid(payload, len(files), editing=True):
            self.refused.append(problems)
            return 400, {"code": 50035, "message": "Invalid Form Body", "errors": problems}
        found = next((s for s in self.sent if s.id == message_id), None)
        if found is None:
            return 404, {"message": "Unknown Message", "code": 10008}
        if "content" in payload:
            found.edits.append(found.content)
            found.content = str(payload["content"] or "")
        if "components" in payload:
            found.components = list(payload["components"] or [])
        return 200, self._message(found)

    async def _callback(self, request: web.Request, path: str) -> tuple[int, Any]:
        """An interaction's response: a documented type (4 message, 5 deferred message,
        6 deferred update, 7 update, 8 autocomplete, 9 modal, 12 launch)."""
        body = await request.json()
        if not isinstance(body, dict) or body.get("type") not in {4, 5, 6, 7, 8, 9, 12}:
            self.refused.append([f"interaction response type {body!r}"])
            return 400, {"code": 50035, "message": "Invalid Form Body"}
        interaction = path.split("/")[2]
        self.callbacks.append((interaction, body))
        if request.query.get("with_response") not in {"1", "true", "True"}:
            return 204, None
        # The interaction callback response object (``?with_response=true``).
        return 200, {"interaction": {"id": interaction, "type": 3,
                                     "response_message_loading": body["type"] == 5,
                                     "response_message_ephemeral": False}}  # fmt: skip

    def _message(self, sent: Sent) -> dict[str, Any]:
        return {
            "id": sent.id, "channel_id": sent.channel_id, "author": BOT_USER,
            "content": sent.content, "timestamp": _now(), "edited_timestamp": None,
            "tts": False, "mention_everyone": False, "mentions": [], "mention_roles": [],
            "attachments": [{"id": snowflake(), "filename": name, "size": len(data),
                             "url": f"https://cdn.discordapp.com/attachments/{name}",
                             "proxy_url": f"https://cdn.discordapp.com/attachments/{name}"}
                            for name, data in sent.files],
            "embeds": [], "pinned": False, "type": 0, "flags": 0,
            "components": sent.components,
        }  # fmt: skip


def bot_role(guild_id: str) -> str:
    """The id of the bot's managed role in a guild (made up, stable)."""
    return str(int(guild_id) + 5)


def _role(role_id: str, name: str, tags: dict[str, Any] | None = None) -> dict[str, Any]:
    role = {"id": role_id, "name": name, "color": 0, "hoist": False, "position": 0,
            "permissions": "0", "managed": tags is not None, "mentionable": False,
            "flags": 0}  # fmt: skip
    return {**role, "tags": tags} if tags is not None else role


def dm_of(user_id: str) -> str:
    """The DM channel's id of a person (made up, stable)."""
    return str(int(user_id) + 7)


def _route(method: str, path: str) -> str:
    parts = [p if not (p.isdigit() or len(p) > 40) else "{id}" for p in path.split("/")]
    if len(parts) > 4 and parts[1] == "interactions":
        parts[3] = "{token}"
    return f"{method} {'/'.join(parts)}"


MENTION_KINDS = {"roles", "users", "everyone"}
ALLOWED_FLAGS = 4 | 4096  # SUPPRESS_EMBEDS, SUPPRESS_NOTIFICATIONS


def invalid(payload: dict[str, Any], files: int, *, editing: bool = False) -> list[str]:
    """What in a message's payload Discord would refuse with 50035 "Invalid Form Body",
    by the documented shapes (https://discord.com/developers/docs/resources/message)."""
    problems = []
    content = payload.get("content")
    if content is not None and (not isinstance(content, str) or len(content) > 2000):
        problems.append("content: a string of at most 2000 characters")
    nonce = payload.get("nonce")
    if nonce is not None and (not isinstance(nonce, int | str) or len(str(nonce)) > 25):
        problems.append("nonce: an integer or a string of at most 25 characters")
    mentions = payload.get("allowed_mentions")
    parse = mentions.get("parse", []) if isinstance(mentions, dict) else None
    if mentions is not None and (parse is None or not set(parse) <= MENTION_KINDS):
        problems.append("allowed_mentions: parse holds roles, users, everyone")
    rows = payload.get("components")
    if rows is not None:
        if not isinstance(rows, list) or len(rows) > 5:
            problems.append("components: at most 5 action rows")
        for row in rows if isinstance(rows, list) else []:
            buttons = row.get("components") if isinstance(row, dict) else None
            if row.get("type") != 1 or not isinstance(buttons, list) or not 1 <= len(buttons) <= 5:
                problems.append("components: an action row holds 1 to 5 components")
                continue
            for b in buttons:
                label, custom = b.get("label"), b.get("custom_id")
                if b.get("type") != 2 or b.get("style") not in (1, 2, 3, 4):
                    problems.append("components: a button of type 2, style 1 to 4")
                if not isinstance(label, str) or not 0 < len(label) <= 80:
                    problems.append("components: a button's label of 1 to 80 characters")
                if not isinstance(custom, str) or not 0 < len(custom) <= 100:
                    problems.append("components: a button's custom_id of 1 to 100 characters")
    if int(payload.get("flags") or 0) & ~ALLOWED_FLAGS:
        problems.append("flags: only SUPPRESS_EMBEDS and SUPPRESS_NOTIFICATIONS")
    if not editing and not (content or files or rows or payload.get("embeds")):
        problems.append("content, embeds, components or files: one of them (50006)")
    return problems


async def _payload(request: web.Request) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
    if not request.content_type.startswith("multipart/"):
        return dict(await request.json()), []
    payload: dict[str, Any] = {}
    files: list[tuple[str, bytes]] = []
    reader = await request.multipart()
    async for part in reader:
        if part.name == "payload_json":  # type: ignore[union-attr]
            payload = json.loads(await part.text())  # type: ignore[union-attr]
        else:
            files.append((part.filename or "", bytes(await part.read())))  # type: ignore[union-attr]
    return payload, files


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except (OSError, ssl.SSLError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()
