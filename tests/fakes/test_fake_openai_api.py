"""The fake OpenAI endpoint, exercised through the real ``openai`` SDK over HTTP.

These tests double as a record of how the SDK behaves on the wire: what it sends, when it
retries, which exception each failure becomes, and what it makes of malformed answers.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import openai
import pytest

from tests.fakes.openai_api import (
    LATE_TEXT,
    RETRY_NOW,
    UNSCRIPTED_TEXT,
    FakeOpenAI,
    HttpError,
    Reply,
    ToolCalls,
    assert_chat_shape,
)

KEY = "sk-test"
MODEL = "gpt-test"
HI = [{"role": "user", "content": "hi"}]

MakeClient = Callable[..., openai.AsyncOpenAI]


@pytest.fixture
async def llm() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI(api_key=KEY, model=MODEL) as fake:
        yield fake


@pytest.fixture
async def make_client(llm: FakeOpenAI) -> AsyncIterator[MakeClient]:
    clients: list[openai.AsyncOpenAI] = []

    def make(**kwargs: Any) -> openai.AsyncOpenAI:
        options: dict[str, Any] = {
            "base_url": llm.base_url,
            "api_key": KEY,
            "timeout": 5.0,
            "max_retries": 0,
        }
        options.update(kwargs)
        client = openai.AsyncOpenAI(**options)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


async def ask(client: openai.AsyncOpenAI, **kwargs: Any) -> Any:
    request: dict[str, Any] = {"model": MODEL, "messages": HI}
    request.update(kwargs)
    return await client.chat.completions.create(**request)


WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


# -- replies ------------------------------------------------------------------------------------


async def test_plain_reply(llm: FakeOpenAI, make_client: MakeClient) -> None:
    llm.reply("Hello there!")
    response = await ask(make_client(), temperature=0.2, max_tokens=50)

    assert isinstance(response, openai.types.chat.ChatCompletion)
    assert response.object == "chat.completion"
    assert response.model == MODEL
    choice = response.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.role == "assistant"
    assert choice.message.content == "Hello there!"
    assert choice.message.tool_calls is None
    assert response.usage is not None
    assert response.usage.completion_tokens == 3  # 12 characters / 4
    assert response.usage.total_tokens == (
        response.usage.prompt_tokens + response.usage.completion_tokens
    )

    [recorded] = llm.requests
    assert (recorded.method, recorded.path, recorded.status) == (
        "POST",
        "/v1/chat/completions",
        200,
    )
    assert recorded.headers["authorization"] == f"Bearer {KEY}"
    assert recorded.headers["content-type"] == "application/json"
    assert recorded.headers["x-stainless-read-timeout"] == "5.0"
    assert recorded.retry_count == 0
    # Only the arguments given are sent: no nulls for the omitted ones.
    assert llm.chat_requests() == [
        {"model": MODEL, "messages": HI, "temperature": 0.2, "max_tokens": 50}
    ]
    assert llm.unscripted == 0
    assert llm.remaining == 0


async def test_tool_calls_are_parsed(llm: FakeOpenAI, make_client: MakeClient) -> None:
    llm.tool_calls(
        [
            ("weather", {"city": "Paris"}),
            ("weather", '{"city": "Ro', "my_id"),  # truncated arguments, kept verbatim
        ],
        text="Let me check.",
        usage={"prompt_tokens": 100, "completion_tokens": 7},
    )
    response = await ask(make_client(), tools=[WEATHER_TOOL], tool_choice="auto")

    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    first, second = choice.message.tool_calls
    assert first.id == "call_1"
    assert first.type == "function"
    assert first.function.name == "weather"
    assert isinstance(first.function.arguments, str)
    assert json.loads(first.function.arguments) == {"city": "Paris"}
    assert second.id == "my_id"
    assert second.function.arguments == '{"city": "Ro'
    assert (response.usage.prompt_tokens, response.usage.total_tokens) == (100, 107)
    assert llm.chat_requests()[0]["tools"] == [WEATHER_TOOL]


async def test_tool_calls_without_text_have_null_content(
    llm: FakeOpenAI, make_client: MakeClient
) -> None:
    llm.tool_calls([("weather", {"city": "Oslo"})])
    llm.reply("Sunny.", finish_reason="length")
    client = make_client()
    first = await ask(client, tools=[WEATHER_TOOL])
    assert first.choices[0].message.content is None
    [call] = first.choices[0].message.tool_calls
    assert call.id == "call_1"

    history = [
        *HI,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 20°C"},
    ]
    second = await ask(client, messages=history, tools=[WEATHER_TOOL])
    assert second.choices[0].finish_reason == "length"
    assert second.choices[0].message.content == "Sunny."
    assert_chat_shape(llm.chat_requests()[1])


async def test_unscripted_and_responder(llm: FakeOpenAI, make_client: MakeClient) -> None:
    client = make_client()
    assert (await ask(client)).choices[0].message.content == UNSCRIPTED_TEXT
    assert llm.unscripted == 1

    def echo(body: dict[str, Any]) -> Reply | dict[str, Any] | None:
        text = body["messages"][-1]["content"]
        if text == "raw":
            return {"choices": []}
        if text == "nothing":
            return None
        return Reply(f"you said {text}")

    llm.responder = echo
    llm.reply("queued first")  # the queue wins over the responder
    assert (await ask(client)).choices[0].message.content == "queued first"
    said = await ask(client, messages=[{"role": "user", "content": "x"}])
    assert said.choices[0].message.content == "you said x"
    assert (await ask(client, messages=[{"role": "user", "content": "raw"}])).choices == []
    nothing = await ask(client, messages=[{"role": "user", "content": "nothing"}])
    assert nothing.choices[0].message.content == UNSCRIPTED_TEXT
    assert llm.unscripted == 2

    async def slow_tools(body: dict[str, Any]) -> ToolCalls:
        await asyncio.sleep(0)
        return ToolCalls([("weather", {"city": body["model"]})])

    llm.responder = slow_tools
    response = await ask(client, tools=[WEATHER_TOOL])
    assert response.choices[0].message.tool_calls[0].function.arguments == '{"city": "gpt-test"}'


# -- errors and retries -------------------------------------------------------------------------


async def test_500_is_retried_by_the_sdk(llm: FakeOpenAI, make_client: MakeClient) -> None:
    llm.error(500, headers=RETRY_NOW)
    llm.reply("recovered")
    response = await ask(make_client(max_retries=1))

    assert response.choices[0].message.content == "recovered"
    assert [(r.status, r.retry_count) for r in llm.requests] == [(500, 0), (200, 1)]


async def test_500_after_retries_is_internal_server_error(
    llm: FakeOpenAI, make_client: MakeClient
) -> None:
    llm.error(503, headers=RETRY_NOW, times=3)
    with pytest.raises(openai.InternalServerError) as caught:
        await ask(make_client(max_retries=2))
    assert caught.value.status_code == 503
    assert len(llm.requests) == 3
    assert llm.remaining == 0


async def test_429_with_retry_after_zero_backs_off(
    llm: FakeOpenAI, make_client: MakeClient
) -> None:
    # ``retry-after: 0`` is outside the SDK's accepted (0, 120] s range, so it falls back
    # to its own backoff (0.5 s minus up to 25 % jitter) rather than retrying at once.
    llm.error(429, headers={"retry-after": "0"})
    llm.reply("after the limit")
    response = await ask(make_client(max_retries=1))

    assert response.choices[0].message.content == "after the limit"
    first, second = llm.requests
    assert (first.status, second.status, second.retry_count) == (429, 200, 1)
    assert 0.3 <= second.at - first.at < 2.0


async def test_429_exhausted_is_rate_limit_error(llm: FakeOpenAI, make_client: MakeClient) -> None:
    llm.error(429)
    with pytest.raises(openai.RateLimitError) as caught:
        await ask(make_client())
    error = caught.value
    assert error.status_code == 429
    assert error.code == "rate_limit_exceeded"
    assert isinstance(error.body, dict)  # the inner "error" object
    assert error.body["type"] == "requests"


async def test_x_should_retry_false_stops_retries(llm: FakeOpenAI, make_client: MakeClient) -> None:
    llm.error(500, headers={"x-should-retry": "false"})
    with pytest.raises(openai.InternalServerError):
        await ask(make_client(max_retries=3))
    assert len(llm.requests) == 1


async def test_400_is_not_retried(llm: FakeOpenAI, make_client: MakeClient) -> None:
    llm.error(400, {"error": {"message": "context too long", "type": "x", "code": "ctx"}})
    with pytest.raises(openai.BadRequestError) as caught:
        await ask(make_client(max_retries=3))
    assert "context too long" in str(caught.value)
    assert caught.value.code == "ctx"
    assert len(llm.requests) == 1


async def test_plain_text_error_body(llm: FakeOpenAI, make_client: MakeClient) -> None:
    llm.enqueue(HttpError(502, "<html>bad gateway</html>"))
    with pytest.raises(openai.InternalServerError) as caught:
        await ask(make_client())
    assert caught.value.body == "<html>bad gateway</html>"
    assert caught.value.code is None


async def test_401_wrong_key_is_authentication_error(make_client: MakeClient) -> None:
    async with FakeOpenAI(api_key=KEY, require_key=True) as guarded:
        guarded.reply("for the right key only")
        with pytest.raises(openai.AuthenticationError) as caught:
            await ask(make_client(base_url=guarded.base_url, api_key="sk-wrong", max_retries=2))
        assert caught.value.status_code == 401
        assert caught.value.code == "invalid_api_key"
        assert len(guarded.requests) == 1  # 401 is never retried
        assert guarded.remaining == 1  # and consumes no scripted step

        right = await ask(make_client(base_url=guarded.base_url))
        assert right.choices[0].message.content == "for the right key only"


async def test_queued_401(llm: FakeOpenAI, make_client: MakeClient) -> None:
    llm.error(401)
    with pytest.raises(openai.AuthenticationError):
        await ask(make_client())


# -- timeouts and connection failures -----------------------------------------------------------


async def test_hang_times_out(llm: FakeOpenAI, make_client: MakeClient) -> None:
    llm.hang(10)
    started = time.monotonic()
    with pytest.raises(openai.APITimeoutError) as caught:
        await ask(make_client(timeout=0.5))
    assert time.monotonic() - started < 2
    assert isinstance(caught.value, openai.APIConnectionError)  # a subclass of it
    assert llm.requests[0].headers["x-stainless-read-timeout"] == "0.5"


async def test_timeouts_are_retried(llm: FakeOpenAI, make_client: MakeClient) -> None:
    llm.hang(10)
    llm.reply("second try")
    response = await ask(make_client(timeout=0.2, max_retries=1))
    assert response.choices[0].message.content == "second try"
    assert [r.retry_count for r in llm.requests] == [0, 1]


async def test_hang_answers_late(llm: FakeOpenAI, make_client: MakeClient) -> None:
    llm.hang(0.05)
    llm.hang(0.05, then=Reply("late but fine"))
    client = make_client()
    assert (await ask(client)).choices[0].message.content == LATE_TEXT
    assert (await ask(client)).choices[0].message.content == "late but fine"


async def test_down_then_up(llm: FakeOpenAI, make_client: MakeClient) -> None:
    client = make_client()
    llm.reply("before")
    assert (await ask(client)).choices[0].message.content == "before"  # keep-alive opened
    port = llm.port

    await llm.down()
    assert not llm.is_up
    with pytest.raises(openai.APIConnectionError) as caught:
        await ask(client)
    assert not isinstance(caught.value, openai.APITimeoutError)
    assert len(llm.requests) == 1  # nothing reached the fake

    await llm.up()
    assert (llm.is_up, llm.port) == (True, port)
    llm.reply("after")
    assert (await ask(client)).choices[0].message.content == "after"


async def test_down_drops_a_hanging_request(llm: FakeOpenAI, make_client: MakeClient) -> None:
    llm.hang(10)
    pending = asyncio.create_task(ask(make_client(max_retries=0)))
    await llm.wait_for_requests(1)
    await llm.down()
    with pytest.raises(openai.APIConnectionError):
        await asyncio.wait_for(pending, 5)


# -- malformed answers --------------------------------------------------------------------------


async def test_malformed_bodies(llm: FakeOpenAI, make_client: MakeClient) -> None:
    client = make_client()

    # No error for missing fields: the SDK builds the model leniently, absent fields are None.
    llm.raw({"id": "chatcmpl-x", "object": "chat.completion"})
    no_choices = await ask(client)
    assert isinstance(no_choices, openai.types.chat.ChatCompletion)
    assert no_choices.choices is None
    assert no_choices.usage is None

    llm.raw({"choices": []})
    assert (await ask(client)).choices == []

    llm.raw({"choices": [{"message": {"content": ""}}]})
    [choice] = (await ask(client)).choices
    assert (choice.message.content, choice.message.role, choice.finish_reason) == ("", None, None)

    # A JSON value that is not an object comes back as-is.
    llm.raw([1, 2])
    assert await ask(client) == [1, 2]

    # A 200 that is not JSON at all: with a JSON content type, the decoder's own error
    # escapes (it is NOT an openai.OpenAIError); with another content type, the text.
    llm.raw("<html>proxy login</html>")
    with pytest.raises(json.JSONDecodeError):
        await ask(client)
    llm.raw("<html>proxy login</html>", headers={"Content-Type": "text/html"})
    assert await ask(client) == "<html>proxy login</html>"


# -- request validation -------------------------------------------------------------------------


async def test_invalid_request_is_rejected_with_400(
    llm: FakeOpenAI, make_client: MakeClient
) -> None:
    llm.reply("never used")
    with pytest.raises(openai.BadRequestError) as caught:
        await ask(make_client(), messages=[{"role": "tool", "tool_call_id": "x", "content": "?"}])
    assert "matches no earlier assistant tool call" in str(caught.value)
    assert llm.rejected and "tool_call_id 'x'" in llm.rejected[0]
    assert llm.remaining == 1


async def test_other_urls_and_models(make_client: MakeClient) -> None:
    async with FakeOpenAI(model=MODEL, check_model=True) as fake:
        client = make_client(base_url=fake.base_url)
        assert [m.id async for m in client.models.list()] == [MODEL]
        with pytest.raises(openai.NotFoundError) as caught:
            await ask(client, model="gpt-other")
        assert caught.value.code == "model_not_found"

        no_v1 = make_client(base_url=fake.base_url.removesuffix("/v1"))
        with pytest.raises(openai.NotFoundError, match=r"Invalid URL \(POST /chat/completions\)"):
            await ask(no_v1)
        assert [r.path for r in fake.requests][-1] == "/chat/completions"


async def test_wait_for_requests(llm: FakeOpenAI, make_client: MakeClient) -> None:
    llm.hang(10)
    pending = asyncio.create_task(ask(make_client(timeout=5)))
    [seen] = await llm.wait_for_requests(1, timeout=5)
    assert seen.status is None  # recorded on arrival, still hanging
    with pytest.raises(AssertionError, match="expected 2 request"):
        await llm.wait_for_requests(2, timeout=0.05)
    await llm.down()
    with pytest.raises(openai.APIConnectionError):
        await pending


CONVERSATION: dict[str, Any] = {
    "model": MODEL,
    "messages": [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "rainy"},
        {"role": "assistant", "content": "Paris is sunny, Rome is rainy."},
        {"role": "user", "content": [{"type": "text", "text": "Thanks!"}]},
    ],
    "tools": [WEATHER_TOOL],
    "tool_choice": "auto",
    "temperature": 0.3,
    "max_tokens": 200,
}


def test_assert_chat_shape_accepts_a_multi_step_conversation() -> None:
    assert_chat_shape(CONVERSATION)
    assert_chat_shape({**CONVERSATION, "tool_choice": "required"})
    assert_chat_shape(
        {**CONVERSATION, "tool_choice": {"type": "function", "function": {"name": "weather"}}}
    )


def _with_message(index: int, message: dict[str, Any] | None) -> dict[str, Any]:
    messages = list(CONVERSATION["messages"])
    if message is None:
        del messages[index]
    else:
        messages[index] = message
    return {**CONVERSATION, "messages": messages}


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (
            _with_message(3, {"role": "tool", "tool_call_id": "call_9", "content": "?"}),
            "tool_call_id 'call_9' matches no earlier assistant tool call",
        ),
        (_with_message(4, None), "unanswered tool_call_ids: ['call_2']"),
        (
            {**CONVERSATION, "messages": [*CONVERSATION["messages"][:3]]},
            "unanswered at the end: ['call_1', 'call_2']",
        ),
        (
            {**CONVERSATION, "messages": [*CONVERSATION["messages"], CONVERSATION["messages"][3]]},
            "must directly follow",
        ),
        (_with_message(0, {"role": "developer", "content": "x"}), "role must be one of"),
        (_with_message(1, {"role": "user"}), "content is missing"),
        (
            _with_message(
                2,
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "weather", "arguments": {}},
                        }
                    ],
                },
            ),
            "arguments must be a string",
        ),
        ({**CONVERSATION, "model": ""}, "model: must be a non-empty string"),
        ({**CONVERSATION, "tools": []}, "tools: must be a non-empty list"),
        (
            {
                **CONVERSATION,
                "tools": [
                    {"type": "function", "function": {**WEATHER_TOOL["function"], "name": f"w{n}"}}
                    for n in range(129)
                ],
            },
            "array too long: at most 128 tools",
        ),
        (
            {
                **CONVERSATION,
                "tools": [{"type": "function", "function": {"name": "x", "parameters": {}}}],
            },
            "description must be a non-empty string",
        ),
        (
            {
                **CONVERSATION,
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "x",
                            "description": "d",
                            "parameters": {"type": "object", "properties": 3},
                        },
                    }
                ],
                "tool_choice": "auto",
            },
            "not a valid JSON schema",
        ),
        ({**CONVERSATION, "tool_choice": "always"}, "tool_choice: must be one of"),
        (
            {k: v for k, v in CONVERSATION.items() if k != "tools"},
            "only allowed when tools are specified",
        ),
        ({**CONVERSATION, "temperature": 3}, "temperature"),
    ],
)
def test_assert_chat_shape_rejects(body: dict[str, Any], problem: str) -> None:
    with pytest.raises(AssertionError) as caught:
        assert_chat_shape(body)
    assert problem in str(caught.value)
