"""The fake Telegram Bot API, exercised through the real aiogram client over HTTP."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from aiogram import Bot, Dispatcher
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.exceptions import (
    TelegramBadRequest,
    TelegramConflictError,
    TelegramForbiddenError,
    TelegramNetworkError,
    TelegramRetryAfter,
    TelegramUnauthorizedError,
)
from aiogram.types import (
    BotCommand,
    BufferedInputFile,
    CallbackQuery,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    Message,
    MessageEntity,
    ReplyKeyboardRemove,
)
from aiohttp import web

from tests.fakes.telegram_api import (
    NOT_MODIFIED,
    PARSE_MODE_UNSUPPORTED,
    FakeTelegramAPI,
    UploadedFile,
)

TOKEN = "123:ABC"
USER = 42


def keyboard(*pairs: tuple[str, str]) -> InlineKeyboardMarkup:
    return InlineKeyboardMarkup(
        inline_keyboard=[[InlineKeyboardButton(text=t, callback_data=d) for t, d in pairs]]
    )


@pytest.fixture
async def api() -> AsyncIterator[FakeTelegramAPI]:
    async with FakeTelegramAPI(token=TOKEN) as fake:
        yield fake


@pytest.fixture
async def bot(api: FakeTelegramAPI) -> AsyncIterator[Bot]:
    # Spelled out once as production code would; other tests may use api.make_bot().
    session = AiohttpSession(api=TelegramAPIServer.from_base(api.base_url))
    client = Bot(TOKEN, session=session)
    try:
        yield client
    finally:
        await client.session.close()


# -- identity ---------------------------------------------------------------------------------


async def test_get_me(api: FakeTelegramAPI, bot: Bot) -> None:
    me = await bot.get_me()
    assert (me.id, me.username, me.first_name, me.is_bot) == (999, "echo_test_bot", "Echo", True)
    [call] = api.calls_of("getMe")
    assert call.token == TOKEN and call.status == 200


async def test_wrong_token_is_unauthorized(api: FakeTelegramAPI) -> None:
    async with api.make_bot("123:WRONG") as wrong:
        with pytest.raises(TelegramUnauthorizedError, match="Unauthorized"):
            await wrong.get_me()
    [call] = api.calls_of("getMe")
    assert call.status == 401
    assert call.response == {"ok": False, "error_code": 401, "description": "Unauthorized"}


# -- sending and editing ----------------------------------------------------------------------


async def test_send_message_with_inline_keyboard_round_trip(api: FakeTelegramAPI, bot: Bot) -> None:
    markup = keyboard(("Approve", "approve:7"), ("Deny", "deny:7"))
    sent = await bot.send_message(USER, "Run the tool?", reply_markup=markup)

    assert isinstance(sent, Message)
    assert sent.chat.id == USER and sent.chat.type == "private"
    assert sent.from_user is not None and sent.from_user.id == 999
    assert sent.text == "Run the tool?"
    assert sent.reply_markup is not None
    assert [b.callback_data for b in sent.reply_markup.inline_keyboard[0]] == [
        "approve:7",
        "deny:7",
    ]

    [record] = api.sent_messages(USER)
    assert record["message_id"] == sent.message_id
    assert record["reply_markup"] == {
        "inline_keyboard": [
            [
                {"text": "Approve", "callback_data": "approve:7"},
                {"text": "Deny", "callback_data": "deny:7"},
            ]
        ]
    }
    call = await api.wait_for_call("sendMessage")
    assert call.params["chat_id"] == USER  # JSON-decoded back to an int
    assert call.params["text"] == "Run the tool?"

    # message ids increase per chat
    second = await bot.send_message(USER, "again")
    other = await bot.send_message(7, "elsewhere")
    assert second.message_id == sent.message_id + 1
    assert other.message_id == 1


async def test_edit_message_text(api: FakeTelegramAPI, bot: Bot) -> None:
    sent = await bot.send_message(USER, "Working…", reply_markup=keyboard(("Stop", "stop")))

    with pytest.raises(TelegramBadRequest, match="message is not modified") as info:
        await bot.edit_message_text(
            "Working…",
            chat_id=USER,
            message_id=sent.message_id,
            reply_markup=keyboard(("Stop", "stop")),
        )
    assert info.value.message == NOT_MODIFIED

    with pytest.raises(TelegramBadRequest, match="message to edit not found"):
        await bot.edit_message_text("x", chat_id=USER, message_id=999)

    # Like Telegram, an edit without reply_markup drops the inline keyboard.
    edited = await bot.edit_message_text("Done", chat_id=USER, message_id=sent.message_id)
    assert isinstance(edited, Message)
    assert edited.text == "Done" and edited.reply_markup is None
    state = api.messages_by_id[(USER, sent.message_id)]
    assert state["text"] == "Done" and state["reply_markup"] is None
    assert api.sent_messages()[0]["text"] == "Working…"  # as originally sent

    with pytest.raises(TelegramBadRequest, match="message is not modified"):
        await bot.edit_message_reply_markup(chat_id=USER, message_id=sent.message_id)
    with_kb = await bot.edit_message_reply_markup(
        chat_id=USER, message_id=sent.message_id, reply_markup=keyboard(("Again", "again"))
    )
    assert isinstance(with_kb, Message) and with_kb.reply_markup is not None


async def test_parse_mode_is_refused_and_explicit_entities_are_checked(
    api: FakeTelegramAPI, bot: Bot
) -> None:
    # The channel sends plain text with explicit entities: a parse_mode is a regression.
    with pytest.raises(TelegramBadRequest, match="parse_mode is not supported") as info:
        await bot.send_message(USER, "<b>bold</b>", parse_mode="HTML")
    assert info.value.message == PARSE_MODE_UNSUPPORTED
    with pytest.raises(TelegramBadRequest, match="parse_mode is not supported"):
        await bot.send_document(
            USER, BufferedInputFile(b"x", filename="x.txt"), caption="*x*", parse_mode="Markdown"
        )
    sent = await bot.send_message(USER, "plain")
    with pytest.raises(TelegramBadRequest, match="parse_mode is not supported"):
        await bot.edit_message_text(
            "<i>x</i>", chat_id=USER, message_id=sent.message_id, parse_mode="HTML"
        )
    with pytest.raises(TelegramBadRequest, match="can't parse entities"):
        await bot.send_message(
            USER, "ab", entities=[MessageEntity(type="bold", offset=1, length=5)]
        )
    assert [m["text"] for m in api.sent_messages()] == ["plain"]  # refused sends: no effect

    good = await bot.send_message(
        USER, "bold <tag>", entities=[MessageEntity(type="bold", offset=0, length=4)]
    )
    assert good.text == "bold <tag>"
    assert good.entities is not None and good.entities[0].type == "bold"
    assert api.sent_messages()[-1]["plain_text"] == "bold <tag>"


async def test_text_limits_and_blocked_chat(api: FakeTelegramAPI, bot: Bot) -> None:
    with pytest.raises(TelegramBadRequest, match="message is too long"):
        await bot.send_message(USER, "x" * 4097)
    await bot.send_message(USER, "x" * 4096)
    with pytest.raises(TelegramBadRequest, match="message text is empty"):
        await bot.send_message(USER, "")  # aiogram omits the empty field altogether
    with pytest.raises(TelegramBadRequest, match="BUTTON_DATA_INVALID"):
        await bot.send_message(USER, "hi", reply_markup=keyboard(("B", "d" * 65)))

    api.block_chat(USER)
    with pytest.raises(TelegramForbiddenError, match="bot was blocked by the user"):
        await bot.send_message(USER, "hello?")
    await bot.send_message(USER + 1, "others still work")


async def test_reply_to_message(api: FakeTelegramAPI, bot: Bot) -> None:
    api.push_message("question")
    [update] = await bot.get_updates()
    assert update.message is not None
    reply = await bot.send_message(USER, "answer", reply_to_message_id=update.message.message_id)
    assert reply.reply_to_message is not None
    assert reply.reply_to_message.text == "question"
    assert reply.message_id == update.message.message_id + 1  # one id sequence per chat
    assert api.sent_messages()[0]["reply_to_message_id"] == update.message.message_id
    with pytest.raises(TelegramBadRequest, match="message to be replied not found"):
        await bot.send_message(USER, "answer", reply_to_message_id=555)


# -- faults -----------------------------------------------------------------------------------


async def test_fail_next_retry_after(api: FakeTelegramAPI, bot: Bot) -> None:
    api.fail_next(
        "sendMessage", status=429, description="Too Many Requests: retry after 7", retry_after=7
    )
    with pytest.raises(TelegramRetryAfter) as info:
        await bot.send_message(USER, "one")
    assert info.value.retry_after == 7
    assert api.sent_messages() == []
    await bot.send_message(USER, "two")  # only the next call failed
    assert [m["text"] for m in api.sent_messages()] == ["two"]

    api.fail_next("getMe", status=502, count=2)
    for _ in range(2):
        with pytest.raises(Exception, match="Bad Gateway"):
            await bot.get_me()
    await bot.get_me()


async def test_network_faults(api: FakeTelegramAPI, bot: Bot) -> None:
    api.disconnect_next("sendMessage")
    with pytest.raises(TelegramNetworkError):
        await bot.send_message(USER, "lost")

    # A slow answer: the client times out, but Telegram did deliver the message.
    api.delay_next("sendMessage", 2)
    with pytest.raises(TelegramNetworkError, match="timeout"):
        await bot.send_message(USER, "slow", request_timeout=1)
    assert [m["text"] for m in api.sent_messages()] == ["slow"]


async def test_enforce_limits_burst_gets_429() -> None:
    async with FakeTelegramAPI(token=TOKEN, enforce_limits=True) as api, api.make_bot() as bot:
        delivered, retry_afters = 0, []
        for i in range(10):
            try:
                await bot.send_message(USER, f"spam {i}")
                delivered += 1
            except TelegramRetryAfter as exc:
                retry_afters.append(exc.retry_after)
        assert delivered in (3, 4)  # the burst allowance (+1 if the loop took over a second)
        assert len(retry_afters) == 10 - delivered and all(r >= 1 for r in retry_afters)
        assert api.rate_limited == len(retry_afters)
        await bot.send_message(USER + 1, "another chat has its own budget")


# -- updates ----------------------------------------------------------------------------------


async def test_get_updates_and_offset_confirmation(api: FakeTelegramAPI, bot: Bot) -> None:
    prompt = await bot.send_message(USER, "Approve?", reply_markup=keyboard(("Yes", "yes:1")))
    first = api.push_message("hello", username="alice")
    second, callback_id = api.push_callback("yes:1", message_id=prompt.message_id)
    assert second == first + 1

    updates = await bot.get_updates(timeout=0)
    assert [u.update_id for u in updates] == [first, second]
    message = updates[0].message
    assert isinstance(message, Message)
    assert message.text == "hello" and message.chat.id == USER
    assert message.from_user is not None and message.from_user.username == "alice"
    query = updates[1].callback_query
    assert isinstance(query, CallbackQuery)
    assert query.id == callback_id and query.data == "yes:1"
    assert isinstance(query.message, Message)
    assert query.message.message_id == prompt.message_id

    # Unconfirmed updates come again; an offset past them confirms them.
    assert [u.update_id for u in await bot.get_updates()] == [first, second]
    assert await bot.get_updates(offset=second + 1) == []
    assert api.offsets == [None, None, second + 1]
    assert await bot.get_updates() == []

    assert await bot.answer_callback_query(callback_id, text="Approved")
    assert api.callback_answers[callback_id]["text"] == "Approved"
    with pytest.raises(TelegramBadRequest, match="query is too old"):
        await bot.answer_callback_query(callback_id)


async def test_odd_updates(api: FakeTelegramAPI, bot: Bot) -> None:
    api.push_callback("orphan", message_id=None)
    api.push_update(
        {
            "edited_message": {
                "message_id": 5,
                "date": 0,
                "chat": {"id": USER, "type": "private", "first_name": "U"},
                "text": "edited",
            }
        }
    )
    api.push_message("/start arg")
    updates = await bot.get_updates()
    assert updates[0].callback_query is not None and updates[0].callback_query.message is None
    assert updates[1].edited_message is not None
    command = updates[2].message
    assert command is not None and command.entities is not None
    assert command.entities[0].type == "bot_command" and command.entities[0].length == 6

    # allowed_updates filters updates created after the call
    await bot.get_updates(offset=updates[-1].update_id + 1, allowed_updates=["message"])
    api.push_callback("ignored", message_id=None)
    api.push_message("kept")
    [kept] = await bot.get_updates()
    assert kept.message is not None and kept.message.text == "kept"
    assert len(api.filtered_updates) == 1


async def test_long_poll_returns_when_an_update_arrives(api: FakeTelegramAPI, bot: Bot) -> None:
    started = time.monotonic()
    assert await bot.get_updates(timeout=1) == []
    assert 0.9 <= time.monotonic() - started < 3

    calls_before = len(api.calls)
    poll = asyncio.create_task(bot.get_updates(timeout=30))
    await api.wait_for_call("getUpdates", after=calls_before)
    started = time.monotonic()
    api.push_message("wake up")
    updates = await asyncio.wait_for(poll, 5)
    assert time.monotonic() - started < 1
    assert [u.message.text for u in updates if u.message] == ["wake up"]


async def test_a_second_poller_terminates_the_first(api: FakeTelegramAPI, bot: Bot) -> None:
    first = asyncio.create_task(bot.get_updates(timeout=30))
    await api.wait_for_call("getUpdates")
    second = asyncio.create_task(bot.get_updates(timeout=30))
    with pytest.raises(TelegramConflictError, match="terminated by other getUpdates"):
        await asyncio.wait_for(first, 5)
    api.push_message("for the survivor")
    assert len(await asyncio.wait_for(second, 5)) == 1


async def test_dispatcher_polling_end_to_end(api: FakeTelegramAPI) -> None:
    dp = Dispatcher()

    @dp.message()
    async def echo(message: Message) -> None:
        await message.answer(f"echo: {message.text}", reply_markup=keyboard(("OK", "ok")))

    @dp.callback_query()
    async def pressed(query: CallbackQuery) -> None:
        await query.answer("noted")

    bot = api.make_bot()
    polling = asyncio.create_task(dp.start_polling(bot, polling_timeout=1, handle_signals=False))
    try:
        await api.wait_for_call("getUpdates")
        api.push_message("ping")
        call = await api.wait_for_call("sendMessage")
        assert call.params["text"] == "echo: ping"
        [sent] = api.sent_messages(USER)
        _, callback_id = api.push_callback("ok", message_id=sent["message_id"])
        await api.wait_for_call("answerCallbackQuery")
        assert api.callback_answers[callback_id]["text"] == "noted"
    finally:
        await dp.stop_polling()
        await asyncio.wait_for(polling, 10)


async def test_wait_for_call_times_out_with_context(api: FakeTelegramAPI, bot: Bot) -> None:
    await bot.get_me()
    with pytest.raises(AssertionError, match="calls seen: getMe"):
        await api.wait_for_call("sendMessage", timeout=0.2)
    waiter = asyncio.create_task(
        api.wait_for_call("sendMessage", lambda c: c.params["text"] == "b", after=len(api.calls))
    )
    await bot.send_message(USER, "a")
    await bot.send_message(USER, "b")
    assert (await waiter).params["text"] == "b"


# -- webhooks and commands --------------------------------------------------------------------


async def test_webhook_mode(api: FakeTelegramAPI, bot: Bot) -> None:
    received: list[tuple[str | None, dict[str, object]]] = []

    async def hook(request: web.Request) -> web.Response:
        received.append(
            (request.headers.get("X-Telegram-Bot-Api-Secret-Token"), await request.json())
        )
        return web.Response()

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
    try:
        assert await bot.set_webhook(url, secret_token="s3cret", drop_pending_updates=True)
        assert api.webhook is not None and api.webhook.secret_token == "s3cret"
        assert (await bot.get_webhook_info()).url == url
        with pytest.raises(TelegramConflictError, match="webhook is active"):
            await bot.get_updates()
        with pytest.raises(TelegramBadRequest, match="secret token"):
            await bot.set_webhook(url, secret_token="not/allowed")

        update_id = api.push_message("via webhook")
        assert await api.deliver_webhook(None, update_id) == 200
        assert api.pending_updates == []
        assert await api.deliver_webhook(url, {"message": {}}, secret_token=None) == 200
        assert received[0][0] == "s3cret"
        assert received[0][1]["message"]["text"] == "via webhook"  # type: ignore[index]
        assert received[1][0] is None

        assert await bot.delete_webhook()
        assert await bot.get_updates() == []
    finally:
        await runner.cleanup()


async def test_commands(api: FakeTelegramAPI, bot: Bot) -> None:
    assert await bot.get_my_commands() == []
    await bot.set_my_commands([BotCommand(command="help", description="Show help")])
    [command] = await bot.get_my_commands()
    assert (command.command, command.description) == ("help", "Show help")
    assert api.my_commands() == [{"command": "help", "description": "Show help"}]
    with pytest.raises(TelegramBadRequest, match="BOT_COMMAND_INVALID"):
        await bot.set_my_commands([BotCommand(command="Help", description="x")])


async def test_files_and_reply_keyboards(api: FakeTelegramAPI, bot: Bot) -> None:
    doc = await bot.send_document(
        USER,
        BufferedInputFile(b"log line", filename="log.txt"),
        caption="log",
    )
    assert doc.document is not None and doc.caption == "log"
    call = api.calls_of("sendDocument")[0]
    upload = call.params[call.params["document"].removeprefix("attach://")]
    assert isinstance(upload, UploadedFile)
    assert (upload.filename, upload.data) == ("log.txt", b"log line")
    photo = await bot.send_photo(USER, "AgACphotoid")
    assert photo.photo is not None and photo.photo[0].file_id == "AgACphotoid"

    # Only inline keyboards come back on the Message; reply keyboards are just recorded.
    removed = await bot.send_message(USER, "bye", reply_markup=ReplyKeyboardRemove())
    assert removed.reply_markup is None
    assert api.sent_messages()[-1]["reply_markup"] == {"remove_keyboard": True}


async def test_chat_action_and_unknown_methods(api: FakeTelegramAPI, bot: Bot) -> None:
    assert await bot.send_chat_action(USER, "typing")
    assert await bot.pin_chat_message(USER, 1)  # generic fallback: recorded, answers true
    assert api.calls_of("pinChatMessage")[0].params == {"chat_id": USER, "message_id": 1}
