"""The console's HTTP side: sign-in, the live queue of pending requests, deciding.

Served by the daemon's one HTTP server under ``/console/`` (``mount``) when
``[console] enabled``. Every page is server-rendered HTML; every action is a plain form
POST carrying the session's CSRF token, so all of it works with script off — the one
script (``static/console.js``) only keeps the queue live from ``/console/events``
(Server-Sent Events). Each response carries the strict headers of ``security.HEADERS``.

A decision taken here is an inbound like a button press (``DecisionInbound``, ``via =
"console"``), applied by the dispatcher with the gate's compare-and-set; the page then
shows what became of it, or who decided the request first.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, quote

from aiohttp import web

from ..approvals.gate import ALLOW_FOR_SECONDS, ApprovalGate
from ..approvals.routing import VIA_CONSOLE, ApproverDirectory
from ..events import ApprovalDecision, DecisionInbound, DecisionVerb, InboundStatus, Sender
from ..http import HttpServer
from ..live import Live
from ..store import Store, Tx
from ..store.console import ConsoleSessionRow
from . import requests as req
from .audit import AuditPage
from .auth import COOKIE, ConsoleUser, audit_session, session_of, sign_in
from .feed import Feed
from .render import Clock, environment
from .security import RateLimit, peer_key, safe_next, same_origin, secure, tokens_match
from .status import StatusPage

log = logging.getLogger(__name__)

Page = Callable[[web.Request, "Visitor"], Awaitable[web.StreamResponse]]
FormPage = Callable[[web.Request, "Visitor", dict[str, str]], Awaitable[web.StreamResponse]]

# Sign-ins a minute from every address together, as a multiple of [console] login_rate.
LOGINS_IN_ALL = 10
# A form's body, at most (a decision is a few dozen bytes).
MAX_FORM = 16 * 1024
# How long a decision's POST waits for the dispatcher before showing "submitted".
DECISION_WAIT = 5.0
# How long a decision's page looks again for the approved call's result.
RESULT_WAIT = 300.0
# Live streams open at once, per session and in all: each holds a connection.
STREAMS_PER_SESSION = 4
STREAMS = 32
# A stream says something at least this often (a comment), so proxies keep it open.
HEARTBEAT = 15.0
_ID = re.compile(r"^[0-9a-f]{32}$")
_VERBS = {
    "approve": DecisionVerb.APPROVE_ONCE,
    "allow": DecisionVerb.ALLOW_FOR,
    "deny": DecisionVerb.DENY,
}
STATIC = {"console.css": "text/css", "console.js": "text/javascript"}


@dataclass(frozen=True, slots=True)
class Visitor:
    """Who is signed in, for one request."""

    session: ConsoleSessionRow
    user: ConsoleUser


class Console:
    def __init__(self, *, live: Live, store: Store, gate: ApprovalGate, http: HttpServer) -> None:
        self.live = live
        self.store = store
        self.gate = gate
        self.http = http
        self.feed = Feed(store)
        self.templates = environment()
        # As the daemon started: a reload that changes [console] needs a restart.
        self.config = config = live.current.loaded.config.console
        self.logins = RateLimit(config.login_rate)
        # In all, from every address: more, so one address's guesses lock out no one else
        # (behind a reverse proxy every visitor may have the same address: set it there).
        self.all_logins = RateLimit(config.login_rate * LOGINS_IN_ALL)
        self.decisions = RateLimit(config.decision_rate)
        # Each session's open streams, oldest first: a stop asked of each by the newer.
        self.streams: dict[str, list[asyncio.Event]] = {}
        self.static = {
            name: resources.files(__package__).joinpath("static", name).read_bytes()
            for name in STATIC
        }

    @property
    def directory(self) -> ApproverDirectory:
        return self.live.current.directory

    @property
    def clock(self) -> Clock:
        return Clock(self.live.current.loaded.config.bot.timezone)

    # -- lifecycle ------------------------------------------------------------------------
    def mount(self) -> None:
        """Add the routes (before the HTTP server starts)."""
        add = self.http.add_route
        add("GET", "/console", self._to_queue)
        add("GET", "/", self._to_queue)  # the server's root leads to the console
        add("GET", "/console/", self._page(self._queue))
        add("GET", "/console/login", self._public(self._login_form))
        add("POST", "/console/login", self._public(self._login), reads_body=True)
        add("POST", "/console/logout", self._public(self._logout), reads_body=True)
        add("GET", "/console/approvals/{id}", self._page(self._request))
        add("POST", "/console/approvals/{id}", self._form(self._decide), reads_body=True)
        add("GET", "/console/decisions/{id}", self._page(self._decision))
        add("GET", "/console/history", self._page(self._history))
        add("GET", "/console/events", self._page(self._events))
        add("GET", "/console/audit", self._page(AuditPage(self).handle))
        status = StatusPage(self)
        add("GET", "/console/status", self._page(status.handle))
        add("POST", "/console/reminders/{id}/cancel", self._form(status.cancel), reads_body=True)
        add("GET", "/console/static/{name}", self._public(self._static))

    def mount_last(self) -> None:
        """After every other console route (a later one would never be reached): any
        other path under /console/ is a 404 page with the console's headers."""
        self.http.add_route("*", "/console/{tail:.*}", self._public(self._unknown))

    async def start(self) -> None:
        self.feed.start()

    async def stop(self) -> None:
        await self.feed.stop()

    # -- wrappers -------------------------------------------------------------------------
    def _public(
        self, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def public(request: web.Request) -> web.StreamResponse:
            return secure(await handler(request))

        return public

    def _page(self, handler: Page) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """A page for those signed in; others are sent to sign in."""

        async def page(request: web.Request) -> web.StreamResponse:
            started = time.perf_counter()
            visitor = await self._visitor(request)
            if visitor is None:
                return secure(self._not_signed_in(request))
            response = await handler(request, visitor)
            if not response.prepared:  # a stream has sent its headers already
                spent = (time.perf_counter() - started) * 1000
                response.headers["Server-Timing"] = f"app;dur={spent:.2f}"
            return secure(response)

        return page

    def _form(self, handler: FormPage) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """A form post of someone signed in, from the console's own pages (its origin and
        the session's CSRF token checked) — else refused, changing nothing."""

        async def form(request: web.Request) -> web.StreamResponse:
            visitor = await self._visitor(request)
            if visitor is None:
                return secure(self._message(request, 401, "Signed out", SIGNED_OUT))
            fields = await self._fields(request)
            if isinstance(fields, web.StreamResponse):
                return secure(fields)
            if not same_origin(request, self.config.public_url) or not tokens_match(
                fields.get("csrf"), visitor.session.csrf
            ):
                return secure(self._message(request, 403, "Refused", FORGED))
            return secure(await handler(request, visitor, fields))

        return form

    async def _visitor(self, request: web.Request) -> Visitor | None:
        """Who this request's cookie signs in, if they still may: the session is live and
        they are still an approver (the config may have changed since)."""
        secret = request.cookies.get(COOKIE, "")
        if not secret:
            return None
        session = await self.store.run(lambda tx: session_of(tx, secret))
        if session is None:
            return None
        user = ConsoleUser.from_json(session.approver)
        if not self.still_approves(user):
            # Ended, not only ignored: named an approver again (a config edit undone),
            # they sign in anew, as docs/CONSOLE.md says.
            def end(tx: Tx) -> None:
                tx.console.revoke(session.id, time.time())
                audit_session(tx, "console.revoked", session.approver, session.id,
                              by="the console: no longer an approver")  # fmt: skip

            await self.store.run(end)
            return None
        return Visitor(session, user)

    def still_approves(self, user: ConsoleUser) -> bool:
        return user.owner or self.directory.approves(user.address, user.id)

    async def _fields(self, request: web.Request) -> dict[str, str] | web.StreamResponse:
        body = await self.http.read_body(request, key="console", limit=MAX_FORM)
        if isinstance(body, web.Response):
            return body
        try:
            parsed = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=16)
        except (UnicodeDecodeError, ValueError):
            return self._message(request, 400, "Bad form", "The form could not be read.")
        return {key: values[0] for key, values in parsed.items()}

    # -- rendering ------------------------------------------------------------------------
    def render(
        self,
        request: web.Request,
        template: str,
        visitor: Visitor | None = None,
        *,
        status: int = 200,
        **values: Any,
    ) -> web.Response:
        html = self.templates.get_template(template).render(
            user=visitor.user if visitor else None,
            csrf=visitor.session.csrf if visitor else "",
            path=request.path,
            now=time.time(),
            zone=self.clock.name,
            **self.clock.context(),
            **values,
        )
        return web.Response(text=html, status=status, content_type="text/html", charset="utf-8")

    def _message(
        self,
        request: web.Request,
        status: int,
        title: str,
        text: str,
        visitor: Visitor | None = None,
        headers: dict[str, str] | None = None,
    ) -> web.Response:
        response = self.render(
            request, "message.html", visitor, status=status, title=title, text=text
        )
        response.headers.update(headers or {})
        return response

    def _not_signed_in(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/console/events":
            return self._message(request, 401, "Signed out", SIGNED_OUT)
        if request.headers.get("Sec-Fetch-Site") == "cross-site":
            # Arrived by a link from elsewhere (a chat app): the SameSite=Strict cookie was
            # not sent. Load the page again from here, where it is.
            return self.render(request, "again.html", target=request.path_qs)
        return see_other(f"/console/login?next={quote(request.path, safe='/')}")

    # -- sign-in --------------------------------------------------------------------------
    async def _to_queue(self, request: web.Request) -> web.StreamResponse:
        return secure(see_other("/console/"))

    async def _login_form(self, request: web.Request) -> web.StreamResponse:
        """The link's page: a button that signs in (a GET changes nothing, so a chat app
        fetching the link for its preview does not use it up)."""
        link = request.query.get("t", "")
        return self.render(
            request, "login.html", link=link[:256], next=safe_next(request.query.get("next"))
        )

    def _failed(self, request: web.Request) -> web.StreamResponse | None:
        """A sign-in that did not work, counted (by address, a /64 for IPv6, and in all):
        past the limits its answer is 429. Only failures count, and a working link is
        never refused: behind a reverse proxy every visitor has one address, and junk
        posts counted first locked the owner out with a fresh link (a link's 256 random
        bits are never guessed; the limits keep a guesser from hearing more)."""
        peer = peer_key(request.remote)
        if self.logins.allow(peer) and self.all_logins.allow("*"):
            return None
        wait = max(self.logins.retry_after(peer), 1)
        return self._message(
            request, 429, "Too many attempts", TOO_MANY, headers={"Retry-After": str(wait)}
        )

    async def _login(self, request: web.Request) -> web.StreamResponse:
        fields = await self._fields(request)
        if isinstance(fields, web.StreamResponse):
            return self._failed(request) or fields
        if not same_origin(request, self.config.public_url):
            return self._failed(request) or self._message(request, 403, "Refused", FORGED)
        link = fields.get("t", "")
        agent = request.headers.get("User-Agent", "")
        ttl = self.config.session_ttl.total_seconds()
        replaced = request.cookies.get(COOKIE, "")
        opened = None
        address = request.remote or "?"
        if 0 < len(link) <= 256:
            opened = await self.store.run(
                lambda tx: self._open(tx, link, ttl, agent, replaced, address)
            )
        if opened is None:
            refused = self._message(request, 403, "This link does not work", BAD_LINK)
            return self._failed(request) or refused
        user = ConsoleUser.from_json(opened.row.approver)
        if not self.still_approves(user):

            def refuse(tx: Tx) -> None:
                tx.console.revoke(opened.row.id, time.time())
                audit_session(tx, "console.revoked", opened.row.approver, opened.row.id,
                              by="the console: no longer an approver")  # fmt: skip

            await self.store.run(refuse)
            return self._message(request, 403, "This link does not work", BAD_LINK)
        log.info("console: %s signed in (session %s)", user.label, opened.row.id)
        response = see_other(safe_next(fields.get("next")))
        self._set_cookie(response, opened.secret, int(ttl))
        return response

    @staticmethod
    def _open(tx: Tx, link: str, ttl: float, agent: str, replaced: str, address: str) -> Any:
        """Sign in with ``link``; a session the browser had before is ended (a new one is
        always made: a cookie planted before sign-in never becomes a session). Audited
        with the address it came from (a reverse proxy's, behind one)."""
        opened = sign_in(tx, link, ttl, agent)
        if opened is None:
            return None
        row = opened.row
        audit_session(
            tx, "console.signed_in", row.approver, row.id, address=address, agent=row.agent
        )
        if replaced:
            old = session_of(tx, replaced)
            if old is not None:
                tx.console.revoke(old.id, time.time())
                audit_session(tx, "console.signed_out", old.approver, old.id, by="a new sign-in")
        return opened

    def _set_cookie(self, response: web.StreamResponse, value: str, max_age: int) -> None:
        public = self.config.public_url or ""
        response.set_cookie(
            COOKIE,
            value,
            max_age=max_age,
            path="/console/",
            httponly=True,
            samesite="Strict",
            secure=public.startswith("https://"),
        )

    async def _logout(self, request: web.Request) -> web.StreamResponse:
        visitor = await self._visitor(request)
        fields = await self._fields(request)
        if isinstance(fields, web.StreamResponse):
            return fields
        if visitor is not None:
            if not same_origin(request, self.config.public_url) or not tokens_match(
                fields.get("csrf"), visitor.session.csrf
            ):
                return self._message(request, 403, "Refused", FORGED)
            session = visitor.session

            def sign_out(tx: Tx) -> None:
                if tx.console.revoke(session.id, time.time()):
                    audit_session(tx, "console.signed_out", session.approver, session.id,
                                  address=request.remote or "?")  # fmt: skip

            await self.store.run(sign_out)
        response = see_other("/console/login")
        self._set_cookie(response, "", 0)
        return response

    # -- the queue --------------------------------------------------------------------------
    def _queue_values(self, tx: Tx, user: ConsoleUser) -> dict[str, Any]:
        now = time.time()
        return {
            "pending": req.pending(tx, self.gate, self.directory, user),
            "recent": req.decided(
                tx, self.gate, self.directory, user, since=now - req.RECENT, limit=20
            ),
        }

    async def _queue(self, request: web.Request, visitor: Visitor) -> web.StreamResponse:
        values = await self.store.run(lambda tx: self._queue_values(tx, visitor.user))
        return self.render(request, "queue.html", visitor, **values)

    async def _request(self, request: web.Request, visitor: Visitor) -> web.StreamResponse:
        approval_id = request.match_info["id"]
        shown = None
        if _ID.match(approval_id):
            shown = await self.store.run(
                lambda tx: req.one(tx, self.gate, self.directory, visitor.user, approval_id)
            )
        if shown is None:
            return self._message(request, 404, "No such request", NO_REQUEST, visitor)
        return self.render(request, "request.html", visitor, r=shown)

    async def _history(self, request: web.Request, visitor: Visitor) -> web.StreamResponse:
        try:
            page = max(0, min(10_000, int(request.query.get("page", "0"))))
        except ValueError:
            page = 0
        size = req.PAGE // 2

        def read(tx: Tx) -> tuple[list[req.RequestView], dict[str, req.Outcome]]:
            rows = req.decided(
                tx, self.gate, self.directory, visitor.user, limit=size + 1, offset=page * size
            )
            ran = {row.id: req.outcome(tx, row.id) for row in rows[:size]}
            return rows, {key: found for key, found in ran.items() if found is not None}

        rows, outcomes = await self.store.run(read)
        return self.render(
            request, "history.html", visitor, rows=rows[:size], page=page, more=len(rows) > size,
            outcomes=outcomes,
        )  # fmt: skip

    # -- deciding ---------------------------------------------------------------------------
    async def _decide(
        self, request: web.Request, visitor: Visitor, fields: dict[str, str]
    ) -> web.StreamResponse:
        approval_id = request.match_info["id"]
        verb = _VERBS.get(fields.get("verb", ""))
        if not _ID.match(approval_id) or verb is None:
            return self._message(request, 400, "Bad form", "Unknown request or decision.", visitor)
        if not self.decisions.allow(visitor.session.id):
            wait = self.decisions.retry_after(visitor.session.id)
            return self._message(
                request, 429, "Too many decisions", TOO_MANY, visitor, {"Retry-After": str(wait)}
            )
        user = visitor.user
        shown = await self.store.run(
            lambda tx: req.one(tx, self.gate, self.directory, user, approval_id)
        )
        if shown is None:
            return self._message(request, 404, "No such request", NO_REQUEST, visitor)
        message = DecisionInbound(
            address=user.address,
            sender=Sender(id=user.id, name=user.name),
            decision=ApprovalDecision(
                request_id=approval_id,
                verb=verb,
                decided_by=user.address,
                sender_id=user.id,
                via=VIA_CONSOLE,
                allow_for_seconds=ALLOW_FOR_SECONDS if verb is DecisionVerb.ALLOW_FOR else None,
                answered=True,  # the console shows the outcome
            ),
            external_id=f"console-{visitor.session.id}-{secrets.token_hex(8)}",
        )
        await self.store.run(lambda tx: tx.inbox.add(message))
        await self._applied(message.id)
        return see_other(f"/console/decisions/{message.id}")

    async def _applied(self, inbound_id: str) -> None:
        """Wait (a little) until the dispatcher has applied a decision."""
        deadline = time.monotonic() + DECISION_WAIT
        while time.monotonic() < deadline:
            row = await self.store.run(lambda tx: tx.inbox.get(inbound_id))
            if row is None or row.status.terminal:
                return
            await asyncio.sleep(0.02)

    async def _decision(self, request: web.Request, visitor: Visitor) -> web.StreamResponse:
        inbound_id = request.match_info["id"]
        user = visitor.user

        def read(tx: Tx) -> tuple[Any, req.RequestView | None, req.Outcome | None] | None:
            row = tx.inbox.get(inbound_id) if _ID.match(inbound_id) else None
            if row is None or not isinstance(row.message, DecisionInbound):
                return None
            message = row.message
            if message.sender.id != user.id or message.address != user.address:
                return None  # someone else's decision: not theirs to read
            request_id = message.decision.request_id
            shown = req.one(tx, self.gate, self.directory, user, request_id)
            outcome = req.outcome(tx, request_id) if shown is not None else None
            return row, shown, outcome

        found = await self.store.run(read)
        if found is None:
            return self._message(request, 404, "No such decision", NO_REQUEST, visitor)
        row, shown, outcome = found
        done = row.status == InboundStatus.DONE
        verb = row.message.decision.verb.value
        # Looked at again until the approved call has its result, for RESULT_WAIT at most
        # (a call whose turn is gone never has one: the page must not reload for ever).
        running = (
            done and verb != "deny" and outcome is None and shown is not None
            and (shown.decided_at or 0.0) > time.time() - RESULT_WAIT
        )  # fmt: skip
        return self.render(
            request,
            "decision.html",
            visitor,
            r=shown,
            done=done,
            waiting=not row.status.terminal,
            refresh=not row.status.terminal or running,
            running=running,
            outcome=outcome,
            output=self.gate.masker.mask(outcome.output) if outcome else "",
            error=row.error or "",
            verb=verb,
        )

    # -- live -------------------------------------------------------------------------------
    async def _events(self, request: web.Request, visitor: Visitor) -> web.StreamResponse:
        """The queue, again each time it changes: ``event: queue`` with the list's HTML."""
        session_id = visitor.session.id
        mine = self.streams.get(session_id, [])
        if len(mine) >= STREAMS_PER_SESSION:
            # The newest page wins: a phone that changed networks leaves its old stream
            # open on the server until TCP gives up (minutes), and it held a place.
            mine[0].set()
        elif sum(map(len, self.streams.values())) >= STREAMS:
            return self._message(
                request, 429, "Too many pages open", TOO_MANY, visitor, {"Retry-After": "10"}
            )
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "X-Accel-Buffering": "no"}
        )
        secure(response)
        await response.prepare(request)
        stop = asyncio.Event()
        self.streams.setdefault(session_id, []).append(stop)
        listener = self.feed.listen()
        try:
            await self._stream(request, response, visitor, listener, stop)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.feed.forget(listener)
            left = self.streams.get(session_id, [])
            if stop in left:
                left.remove(stop)
            if not left:
                self.streams.pop(session_id, None)
        return response

    async def _stream(
        self,
        request: web.Request,
        response: web.StreamResponse,
        visitor: Visitor,
        listener: Any,
        stop: asyncio.Event,
    ) -> None:
        last = ""
        changed = True
        await response.write(b"retry: 2000\n\n")
        while not self.feed.closed.is_set() and not stop.is_set():
            if await self._visitor(request) is None:  # signed out, revoked, expired
                await response.write(b"event: signed-out\ndata: \n\n")
                return
            if changed:
                html = await self._queue_html(request, visitor)
                if html != last:
                    last = html
                    data = "".join(f"data: {line}\n" for line in html.splitlines())
                    await response.write(f"event: queue\n{data}\n".encode())
            else:
                await response.write(b": ping\n\n")
            changed = await listener.changed(HEARTBEAT)
        if stop.is_set():  # a newer page of the session took its place: no reconnect
            await response.write(b"event: replaced\ndata: \n\n")

    async def _queue_html(self, request: web.Request, visitor: Visitor) -> str:
        values = await self.store.run(lambda tx: self._queue_values(tx, visitor.user))
        return self.render(request, "_queue.html", visitor, **values).text or ""

    async def _unknown(self, request: web.Request) -> web.StreamResponse:
        return self._message(request, 404, "Not found", "There is no such page.")

    # -- assets -----------------------------------------------------------------------------
    async def _static(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in STATIC:
            return web.Response(status=404, text="not found")
        return web.Response(
            body=self.static[name],
            content_type=STATIC[name],
            headers={"Cache-Control": "no-cache"},
        )


def see_other(location: str) -> web.Response:
    """303 to a path of this server (never a URL given by anyone)."""
    return web.Response(status=303, headers={"Location": location})


SIGNED_OUT = (
    "You are not signed in, or your session has ended. Sign in with a one-time link: "
    "run `echo-bot console link` on the server, or send /console to the bot in your own "
    "chat with it."
)
BAD_LINK = (
    "This sign-in link does not work: it may be mistyped, used already or expired. Ask "
    "for a new one: `echo-bot console link` on the server, or /console in your own chat "
    "with the bot."
)
FORGED = (
    "This form did not come from this console, or it is out of date. Nothing was changed. "
    "Go back, reload the page and try again."
)
TOO_MANY = "Too many attempts in a short time. Wait a minute and try again."
NO_REQUEST = "There is no such request that you may see."
