"""``echo-bot webhook deliveries|send``: the webhook's routes seen from the shell.

The ``[webhook]`` section is still the core's (its ``admin_token_env`` and ``max_body``
serve the core's HTTP server), and these commands read the core's store: this module
and ``webhook_client`` are the core's two that name the channel
(tests/test_core_names_no_channel.py). Imports are lazy: building the parser imports
nothing (``echo-bot --version`` runs without the dependencies)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from . import positive

if TYPE_CHECKING:
    from ..config import LoadedConfig, WebhookRoute
    from ..store.approvals import ApprovalRow
    from .admin import CommandContext, StoreAt

NAME = "webhook"  # the channel, its addresses' first part and its subcommand


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    webhook = sub.add_parser(NAME, parents=[common], help="webhook deliveries; test a route")
    webhook_sub = webhook.add_subparsers(
        dest="webhook_command", required=True, metavar="ACTION", action=type(sub)
    )
    deliveries = webhook_sub.add_parser(
        "deliveries", parents=[common], help="deliveries and their state"
    )
    deliveries.add_argument("route", nargs="?", help="only this route")
    deliveries.add_argument(
        "--id", help="one delivery, in full: its id, or a unique prefix of it (6+ characters)"
    )
    deliveries.add_argument("--limit", type=positive, default=20, help="the newest N (default 20)")
    deliveries.set_defaults(handler=_deliveries)
    send = webhook_sub.add_parser(
        "send", parents=[common], help="sign a payload and post it to the daemon"
    )
    send.add_argument("route")
    send.add_argument("--data", type=Path, required=True, help="a JSON file")
    send.add_argument("--event", default=None, help="X-GitHub-Event for github routes")
    send.set_defaults(handler=_send)


def _deliveries(args: argparse.Namespace, context: CommandContext) -> int:
    return deliveries(context.store(), args.route, args.id, args.limit)


def _send(args: argparse.Namespace, context: CommandContext) -> int:
    return send(context.loaded, args.route, args.data, args.event, context.environ)


def deliveries(at: StoreAt, route: str | None, delivery: str | None, limit: int) -> int:
    from .admin import _clock, _with_store

    if delivery:
        return _one_delivery(at, delivery)
    session = f"{NAME}:{route}" if route else None
    rows, pending = _with_store(
        at,
        lambda tx: (
            tx.inbox.recent(NAME, session_key=session, limit=limit),
            tx.approvals.list(),
        ),
        reads_only=True,
    )
    if not rows:
        print("No webhook deliveries.")
        return 0
    waits = {request.turn_id: f"waits for: {_waits_for(request)}" for request in pending}
    for row in rows:
        text = waits.get(row.id) or " ".join(str(row.outcome).split())[:80]
        print(f"{_clock(row.received_at)}  {row.id}  {row.session_key.split(':', 1)[1]:<12} "
              f"{row.status:<16} {text}")  # fmt: skip
    return 0


def _one_delivery(at: StoreAt, given: str) -> int:
    """One delivery, found as a request is (its id or a unique prefix of 6+
    characters), with readable times and what it waits for."""
    from ..approvals.display import escape_text
    from ..store import Tx
    from .admin import _ambiguous, _clock, _id_prefix, _with_store

    wanted = _id_prefix(given, "delivery", "echo-bot webhook deliveries")
    if wanted is None:
        return 2

    def find(tx: Tx) -> tuple[list[str], dict[str, object] | None, list[ApprovalRow]]:
        exact = tx.inbox.describe(wanted)
        if exact is not None and exact.get("channel") == NAME:
            matches = [wanted]
        else:
            matches = tx.inbox.ids_beginning(NAME, wanted)
        info = tx.inbox.describe(matches[0]) if len(matches) == 1 else None
        pending = [r for r in tx.approvals.list() if info and r.turn_id == info["id"]]
        return matches, info, pending

    matches, info, pending = _with_store(at, find, reads_only=True)
    if len(matches) > 1:
        _ambiguous(given, matches, "delivery")
        return 2
    if info is None:
        print(f"echo-bot: no webhook delivery {given}", file=sys.stderr)
        return 1
    session = str(info.get("session") or "")
    print(f"delivery:  {info['id']}")
    print(f"route:     {escape_text(session.removeprefix(NAME + ':'))}")
    print(f"status:    {info['status']}")
    for request in pending:
        print(f"waits for: {_waits_for(request)}")
    print(f"received:  {_clock(_number(info.get('received_at')))}")
    print(f"updated:   {_clock(_number(info.get('updated_at')))}")
    for key in ("result", "error"):
        if info.get(key):
            print(f"{key + ':':<10} {escape_text(str(info[key]))}")
    return 0


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _waits_for(request: ApprovalRow) -> str:
    """What a delivery waiting for approval waits for, as its listing says it."""
    from ..approvals.display import escape_text
    from ..approvals.routing import OWNER_QUEUE

    if request.prompt_to == str(OWNER_QUEUE):
        return f"echo-bot approvals approve {request.id}"
    return f"an approver in {escape_text(request.prompt_to)} (request {request.id})"


def send(
    loaded: LoadedConfig, route_name: str, data: Path, event: str | None, env: Mapping[str, str]
) -> int:
    """Sign ``data`` with the route's secret and POST it to the running daemon."""
    import asyncio

    from ..config import url_host
    from .webhook_client import post_signed

    config = loaded.config
    route = next((r for r in config.webhook.routes if r.name == route_name), None)
    if route is None:
        if not loaded.from_file:
            print(
                f"echo-bot: no webhook route {route_name!r}: no config file was given, and the"
                " embedded defaults have no routes; point at the daemon's config with"
                " --config PATH (or $ECHO_BOT_CONFIG)",
                file=sys.stderr,
            )
            return 2
        names = ", ".join(r.name for r in config.webhook.routes)
        print(
            f"echo-bot: no webhook route {route_name!r} in {loaded.path} "
            + (f"(its routes: {names})" if names else "(it has no [[webhook.routes]])"),
            file=sys.stderr,
        )
        return 2
    secret = env.get(route.secret_env or "", "")
    if route.auth != "none" and not secret:
        print(f"echo-bot: ${route.secret_env} is not set; cannot sign for {route_name}")
        return 2
    try:
        body = data.read_bytes()
    except OSError as exc:
        print(f"echo-bot: cannot read {data}: {exc.strerror}")
        return 2
    if route.auth == "github":
        event = _github_event(route, event)
        if event is None:
            return 2
    host = config.http.host if config.http.host not in ("0.0.0.0", "::") else "127.0.0.1"
    url = f"http://{url_host(host)}:{config.http.port}{route.url_path}"
    try:
        status, answer = asyncio.run(post_signed(url, route.auth, secret, body, event))
    except OSError as exc:
        print(f"echo-bot: cannot reach the daemon at {url}: {exc}", file=sys.stderr)
        return 1
    print(f"HTTP {status} {answer}")
    return 0 if status < 400 else 1


def _github_event(route: WebhookRoute, event: str | None) -> str | None:
    """The X-GitHub-Event to send: ``--event``, else the route's only event, else push.
    Says which; None (after saying why) when the route's filter leaves a choice."""
    if event is None:
        if len(route.events) > 1:
            print(
                f"echo-bot: route {route.name} takes the events {', '.join(route.events)}; "
                "name one with --event"
            )
            return None
        event = route.events[0] if route.events else "push"
        why = "the route's events filter" if route.events else "the default"
        print(f"event: {event} ({why}; --event EVENT sends another)", file=sys.stderr)
    elif route.events and event not in route.events:
        print(
            f"note: route {route.name} ignores {event!r} (events = {route.events})",
            file=sys.stderr,
        )
    return event
