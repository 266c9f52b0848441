"""Two daemons on one PostgreSQL database: the console of either serves the requests of
both, live (the NOTIFY "approval"), and a decision taken on one runs the call once."""

from __future__ import annotations

from pathlib import Path

import pytest

from echo_bot.statuses import ApprovalStatus
from tests.conftest import running_bot
from tests.console.helpers import APPEND_X, CONSOLE, client, decide, queue_event, signed_in
from tests.waiting import eventually

pytestmark = pytest.mark.usefixtures("on_both_engines")


async def test_a_request_made_on_one_instance_shows_live_on_the_others_console(
    on_both_engines: str, tmp_path: Path
) -> None:
    if on_both_engines != "postgres":
        pytest.skip("several daemons share a store only on PostgreSQL")
    async with (
        running_bot(tmp_path / "a", CONSOLE + '[bot]\ninstance = "a"\n') as a,
        running_bot(tmp_path / "b", CONSOLE + '[bot]\ninstance = "b"\n') as b,
        client(a) as session,
    ):
        csrf = await signed_in(a, session)
        async with session.get("/console/events") as stream:
            assert "Nothing is waiting" in await queue_event(stream)
            inbound = await b.channel.say(APPEND_X)
            pending = await eventually(
                lambda: b.store.run(lambda tx: tx.approvals.list()), what="the request"
            )
            request_id = pending[0].id
            while request_id not in await queue_event(stream):
                pass
        async with await decide(session, request_id, "approve", csrf) as result:
            text = await result.text()
        assert "Approved" in text, text

        async def finished() -> bool:
            row = await b.store.run(lambda tx: tx.inbox.get(inbound))
            return row is not None and row.status.terminal

        await eventually(finished, what="the turn finished")
        row = await a.store.run(lambda tx: tx.approvals.get(request_id))
        assert row is not None and row.status == ApprovalStatus.APPROVED
        files = [tmp_path / d / "workspace" / "count.txt" for d in ("a", "b")]
        assert [p.read_text() for p in files if p.exists()] == ["x"]
