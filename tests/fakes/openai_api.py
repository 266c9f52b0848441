"""A scripted fake OpenAI-compatible chat-completions server for tests.

The real ``openai`` SDK talks HTTP to it on 127.0.0.1 (the SDK sends through its own
HTTP stack, which mocks such as respx do not intercept, so we fake the peer instead)::

    async with FakeOpenAI(api_key="sk-test", model="gpt-test") as llm:
        llm.tool_calls([("clock", {"tz": "UTC"})])
        llm.reply("It is noon.")
        client = openai.AsyncOpenAI(base_url=llm.base_url, api_key="sk-test", max_retries=0)
        ...
        assert len(llm.chat_requests()) == 2

Each POST ``{base_url}/chat/completions`` consumes one scripted step, in order: a reply,
tool calls, an HTTP error, a hang, or a raw body. With the script empty, ``responder``
(if set) decides; otherwise the answer is a plain "(fake: no scripted reply)" message,
counted in ``unscripted``. Requests rejected before the script (bad key, bad request
shape when ``validate`` is on, unknown URL) do not consume a step.

``GET {base_url}/models`` lists ``model``; any other URL gets OpenAI's 404 "Invalid URL".
Every request is recorded in ``requests`` before it is answered, so a test woken by
``wait_for_requests`` may inspect a request that is still hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, Self

from aiohttp import web

from tests.waiting import eventually

JSON = dict[str, Any]

UNSCRIPTED_TEXT = "(fake: no scripted reply)"
LATE_TEXT = "(fake: late reply)"

# Error headers that make the SDK retry at once (it ignores ``retry-after: 0`` and falls
# back to its ~0.5 s exponential backoff; ``retry-after-ms`` of 1 means 1 ms).
RETRY_NOW: dict[str, str] = {"retry-after-ms": "1"}

ROLES = frozenset({"system", "user", "assistant", "tool"})
TOOL_CHOICES = frozenset({"auto", "none", "required"})
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MAX_TOOLS = 128  # the API refuses a request offering more

_DEFAULT_ERRORS: dict[int, tuple[str, str, str | None]] = {
    400: ("Invalid request.", "invalid_request_error", None),
    401: (
        "Incorrect API key provided. You can find your API key at "
        "https://platform.openai.com/account/api-keys.",
        "invalid_request_error",
        "invalid_api_key",
    ),
    403: ("You are not allowed to sample from this model.", "invalid_request_error", None),
    404: (
        "The model does not exist or you do not have access to it.",
        "invalid_request_error",
        "model_not_found",
    ),
    408: ("Request timed out.", "timeout", None),
    409: ("Conflict.", "invalid_request_error", None),
    422: ("Unprocessable entity.", "invalid_request_error", None),
    429: (
        "Rate limit reached for requests. Please try again in 1ms.",
        "requests",
        "rate_limit_exceeded",
    ),
    500: (
        "The server had an error while processing your request. Sorry about that!",
        "server_error",
        None,
    ),
    502: ("Bad gateway.", "server_error", None),
    503: ("The engine is currently overloaded, please try again later.", "server_error", None),
}


def error_body(
    message: str,
    type_: str = "invalid_request_error",
    code: str | None = None,
    param: str | None = None,
) -> JSON:
    """An OpenAI-style error body: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def default_error_body(status: int) -> JSON:
    message, type_, code = _DEFAULT_ERRORS.get(
        status,
        (f"HTTP {status}.", "server_error" if status >= 500 else "invalid_request_error", None),
    )
    return error_body(message, type_, code)


def estimate_tokens(text: str) -> int:
    """A plausible token count: about four characters a token, at least one."""
    return max(1, (len(text) + 3) // 4)


# -- script steps -------------------------------------------------------------------------------

ToolCallSpec = tuple[str, Mapping[str, Any] | str] | tuple[str, Mapping[str, Any] | str, str]


@dataclass(frozen=True)
class Reply:
    """A plain assistant message (``finish_reason`` "stop" unless overridden)."""

    text: str | None
    usage: Mapping[str, int] | None = None
    finish_reason: str = "stop"


@dataclass(frozen=True)
class ToolCalls:
    """An assistant message asking for tools; arguments are dicts (JSON-encoded) or raw text."""

    calls: Sequence[ToolCallSpec]
    text: str | None = None
    usage: Mapping[str, int] | None = None
    finish_reason: str = "tool_calls"


@dataclass(frozen=True)
class HttpError:
    """An HTTP error answer; ``body`` None means OpenAI's usual body for ``status``."""

    status: int
    body: JSON | str | None = None
    headers: Mapping[str, str] | None = None


@dataclass(frozen=True)
class Hang:
    """Sleep ``seconds`` (or until the fake goes down/stops), then answer ``then``."""

    seconds: float
    then: Reply | ToolCalls | None = None


@dataclass(frozen=True)
class Raw:
    """Any body as-is: a dict/list is sent as JSON, str/bytes verbatim."""

    body: Any
    status: int = 200
    headers: Mapping[str, str] | None = None


Step = Reply | ToolCalls | HttpError | Hang | Raw
# A responder returns a step (rendered like a queued one), a dict (sent as the 200 body
# as-is) or None (the unscripted default); it may be async.
StepLike = Step | JSON | None
Responder = Callable[[JSON], StepLike | Awaitable[StepLike]]


@dataclass
class Recorded:
    """One request as the fake saw it. ``at`` is ``time.monotonic()`` on arrival."""

    method: str
    path: str
    headers: dict[str, str]
    json: Any
    at: float
    status: int | None = None  # the status answered (None while still in progress)
    step: str | None = None  # which kind of answer it got: "reply", "error", "unscripted"…

    @property
    def retry_count(self) -> int:
        """The SDK's ``x-stainless-retry-count``: 0 on a first attempt, n on the n-th retry."""
        return int(self.headers.get("x-stainless-retry-count", "0") or 0)


# -- the server ---------------------------------------------------------------------------------


class FakeOpenAI:
    def __init__(
        self,
        *,
        api_key: str = "sk-test",
        model: str = "gpt-test",
        require_key: bool = False,
        check_model: bool = False,
        validate: bool = True,
        port: int = 0,
    ) -> None:
        self.api_key = api_key
        self.model = model
        self.require_key = require_key  # wrong/missing Bearer key -> 401
        self.check_model = check_model  # another model name -> 404 model_not_found
        self.validate = validate  # a body failing assert_chat_shape -> 400
        self.port = port
        self.requests: list[Recorded] = []
        self.rejected: list[str] = []  # why validation turned requests down
        self.sends_usage = True  # False: a server that counts no tokens (no ``usage``)
        self.unscripted = 0
        # /v1/audio/transcriptions: what it was sent (model, file name, bytes), and the
        # transcripts it answers with, in order.
        self.transcriptions: list[tuple[str, str, bytes]] = []
        self.transcripts: list[str | HttpError] = []
        # stream=true: content and arguments sent this many characters an event, this
        # many seconds apart; how many streams began, events went out, and were cut.
        self.stream_chunk_chars = 8
        # False: a server (or proxy) that cannot stream answers a streamed request with
        # the whole completion as JSON, as it answers any other.
        self.can_stream = True
        self.stream_delay = 0.0
        self.streams = 0
        self.stream_events = 0
        self.streams_cut = 0
        # Hold every stream before its event number ``stream_hold_after`` (None: never)
        # until ``stream_release`` is set: a reply half written, for as long as a test
        # needs. ``stream_holding`` counts the streams that got there.
        self.stream_hold_after: int | None = None
        self.stream_release = asyncio.Event()
        self.stream_holding = 0
        self.responder: Responder | None = None
        # Asked before the script: a step for the requests it answers (a summary's),
        # None for the others (which take the script's next step as ever).
        self.answer_first: Callable[[JSON], StepLike] | None = None
        self._script: list[Step] = []
        self._ids = itertools.count(1)
        self._changed = asyncio.Event()
        self._wake = asyncio.Event()  # set on down()/stop(): hanging requests give up
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self.base_url = ""

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        app = web.Application(client_max_size=32 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await self.up()

    async def stop(self) -> None:
        self._wake.set()
        self.stream_release.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            self._site = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def is_up(self) -> bool:
        return self._site is not None

    async def down(self) -> None:
        """Stop listening and drop open connections: clients now get "connection refused"."""
        if self._runner is None or self._site is None:
            return
        await self._site.stop()
        self._site = None
        self._wake.set()  # hanging requests end (their connections are gone anyway)
        server = self._runner.server
        if server is not None:
            for connection in server.connections:  # idle keep-alive ones too
                connection.force_close()
        await asyncio.sleep(0)

    async def up(self) -> None:
        """Listen again, on the same port as before."""
        if self._runner is None:
            raise RuntimeError("FakeOpenAI is not started")
        if self._site is not None:
            return
        self._wake = asyncio.Event()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        self._site = site
        if not self.port:
            self.port = self._runner.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    # -- the script -----------------------------------------------------------------------------

    def enqueue(self, *steps: Step) -> None:
        self._script.extend(steps)

    def reply(
        self,
        text: str | None,
        *,
        usage: Mapping[str, int] | None = None,
        finish_reason: str = "stop",
    ) -> None:
        self.enqueue(Reply(text, usage=usage, finish_reason=finish_reason))

    def tool_calls(
        self,
        calls: Sequence[ToolCallSpec],
        text: str | None = None,
        *,
        usage: Mapping[str, int] | None = None,
        finish_reason: str = "tool_calls",
    ) -> None:
        """Queue a tool-call answer: ``[(name, {args} | "raw arguments"[, id]), ...]``."""
        self.enqueue(ToolCalls(list(calls), text=text, usage=usage, finish_reason=finish_reason))

    def error(
        self,
        status: int,
        body: JSON | str | None = None,
        headers: Mapping[str, str] | None = None,
        *,
        times: int = 1,
    ) -> None:
        self.enqueue(*[HttpError(status, body, headers)] * times)

    def hang(self, seconds: float = 30.0, then: Reply | ToolCalls | None = None) -> None:
        """Queue an answer that comes after ``seconds`` (for client timeouts)."""
        self.enqueue(Hang(seconds, then))

    def raw(
        self, body: Any, *, status: int = 200, headers: Mapping[str, str] | None = None
    ) -> None:
        """Queue an arbitrary body (dict/list as JSON; str/bytes verbatim, as JSON content)."""
        self.enqueue(Raw(body, status, headers))

    @property
    def remaining(self) -> int:
        """Scripted steps not consumed yet."""
        return len(self._script)

    # -- inspection -----------------------------------------------------------------------------

    def chat_requests(self) -> list[Any]:
        """The JSON bodies of every chat-completions request, in order."""
        return [r.json for r in self.requests if r.path.endswith("/chat/completions")]

    async def wait_for_requests(self, n: int, timeout: float = 10.0) -> list[Recorded]:
        """Wait until at least ``n`` requests (of any kind) have arrived; returns them all."""

        def seen() -> str:
            got = ", ".join(f"{r.method} {r.path}" for r in self.requests) or "none"
            return f"expected {n} request(s), got {len(self.requests)}: {got}"

        await eventually(
            lambda: len(self.requests) >= n, timeout, seen, woken_by=lambda: self._changed.wait()
        )
        return list(self.requests)

    async def wait_until(self, check: Callable[[], bool], timeout: float = 10.0) -> None:
        """Wait until ``check()`` holds (looked at after every request and stream event)."""
        await eventually(check, timeout, woken_by=lambda: self._changed.wait())

    # -- HTTP plumbing --------------------------------------------------------------------------

    def _pulse(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "POST" and request.path == "/v1/audio/transcriptions":
            return await self._transcribe(request)
        raw = await request.read()
        body: Any = None
        parse_error = False
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", "replace")
                parse_error = True
        record = Recorded(
            method=request.method,
            path=request.path,
            headers={k.lower(): v for k, v in request.headers.items()},
            json=body,
            at=time.monotonic(),
        )
        self.requests.append(record)
        self._pulse()
        try:
            response, record.step = await self._answer(request, record, parse_error)
        except BaseException:
            record.status, record.step = 499, record.step or "aborted"
            raise
        record.status = response.status
        self._pulse()
        return response

    async def _answer(
        self, request: web.Request, record: Recorded, parse_error: bool
    ) -> tuple[web.StreamResponse, str]:
        if self.require_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            given = request.headers.get("Authorization", "")
            message = (
                "You didn't provide an API key. You need to provide your API key in an "
                "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
                if not given
                else "Incorrect API key provided. You can find your API key at "
                "https://platform.openai.com/account/api-keys."
            )
            code = None if not given else "invalid_api_key"
            return _json(error_body(message, "invalid_request_error", code), 401), "auth"

        path = request.path
        if request.method == "GET" and path == "/v1/models":
            listing = {
                "object": "list",
                "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "fake"}],
            }
            return _json(listing), "models"
        if not (request.method == "POST" and path == "/v1/chat/completions"):
            message = f"Invalid URL ({request.method} {path.removeprefix('/v1')})"
            return _json(error_body(message), 404), "unknown_url"

        if parse_error or not isinstance(record.json, dict):
            message = (
                "We could not parse the JSON body of your request. (HINT: This likely means "
                "you aren't using your HTTP library correctly.)"
            )
            return _json(error_body(message), 400), "bad_json"
        body: JSON = record.json
        if self.validate:
            try:
                assert_chat_shape(body)
            except AssertionError as exc:
                self.rejected.append(str(exc))
                return _json(error_body(f"Invalid request: {exc}"), 400), "invalid"
        if self.check_model and body.get("model") != self.model:
            message = (
                f"The model `{body.get('model')}` does not exist or you do not have access to it."
            )
            return _json(error_body(message, code="model_not_found"), 404), "model_not_found"

        step = await self._next_step(body)
        if step is None:
            self.unscripted += 1
            return await self._render(request, body, Reply(UNSCRIPTED_TEXT)), "unscripted"
        if isinstance(step, dict):
            return _json(step), "responder"
        return await self._render(request, body, step), _step_name(step)

    async def _next_step(self, body: JSON) -> StepLike:
        early = self.answer_first(body) if self.answer_first is not None else None
        if early is not None:
            return early
        if self._script:
            return self._script.pop(0)
        if self.responder is None:
            return None
        answer = self.responder(body)
        if inspect.isawaitable(answer):
            return await answer
        return answer

    async def _render(self, request: web.Request, body: JSON, step: Step) -> web.StreamResponse:
        match step:
            case Reply() | ToolCalls() if body.get("stream") and self.can_stream:
                return await self._stream(request, body, self._completion(body, step))
            case Reply() | ToolCalls():
                return _json(self._completion(body, step))
            case HttpError(status=status, body=error, headers=headers):
                payload = default_error_body(status) if error is None else error
                if isinstance(payload, str):
                    return web.Response(status=status, text=payload, headers=dict(headers or {}))
                return _json(payload, status, headers)
            case Hang(seconds=seconds, then=then):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), seconds)
                return await self._render(request, body, then or Reply(LATE_TEXT))
            case Raw(body=raw, status=status, headers=headers):
                if isinstance(raw, str | bytes):
                    out = {"Content-Type": "application/json", **dict(headers or {})}
                    data = raw.encode() if isinstance(raw, str) else raw
                    return web.Response(status=status, body=data, headers=out)
                return _json(raw, status, headers)
        raise TypeError(f"not a script step: {step!r}")

    async def _transcribe(self, request: web.Request) -> web.StreamResponse:
        """OpenAI's /v1/audio/transcriptions: multipart with ``file`` and ``model``; the
        answer is the next of ``transcripts`` (an HttpError there fails the request)."""
        if self.require_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return _json(error_body("Incorrect API key provided.", code="invalid_api_key"), 401)
        if not request.content_type.startswith("multipart/"):
            return _json(error_body("Expected multipart/form-data", param="file"), 400)
        form = await request.post()
        upload, model = form.get("file"), form.get("model")
        if not isinstance(upload, web.FileField) or not model:
            return _json(error_body("file and model are required", param="file"), 400)
        data = upload.file.read()
        self.transcriptions.append((str(model), upload.filename, data))
        self._pulse()
        if not data:
            return _json(error_body("The audio file is empty.", param="file"), 400)
        answer = self.transcripts.pop(0) if self.transcripts else f"(speech in {upload.filename})"
        if isinstance(answer, HttpError):
            return await self._render(request, {}, answer)
        return _json({"text": answer})

    async def _stream(
        self, http: web.Request, request: JSON, completion: JSON
    ) -> web.StreamResponse:
        """The completion as chat.completion.chunk server-sent events, as OpenAI streams
        it: the role first, then the content ``stream_chunk_chars`` at a time, each tool
        call as its id and name then its arguments in pieces, the finish reason, usage
        when ``stream_options.include_usage``, and ``[DONE]``; ``stream_delay`` seconds
        between events. A client that goes away mid-stream is counted in
        ``streams_cut``."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        message, choice = completion["choices"][0]["message"], completion["choices"][0]
        base = {k: completion[k] for k in ("id", "created", "model", "system_fingerprint")}
        base["object"] = "chat.completion.chunk"
        size = max(1, self.stream_chunk_chars)

        def event(delta: JSON, finish: str | None = None) -> JSON:
            return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                         "finish_reason": finish}]}  # fmt: skip

        events = [event({"role": "assistant", "content": ""})]
        text = message.get("content") or ""
        events += [event({"content": text[i : i + size]}) for i in range(0, len(text), size)]
        for index, call in enumerate(message.get("tool_calls") or []):
            head = {"index": index, "id": call["id"], "type": "function",
                    "function": {"name": call["function"]["name"], "arguments": ""}}  # fmt: skip
            events.append(event({"tool_calls": [head]}))
            arguments = call["function"]["arguments"]
            for i in range(0, len(arguments), size):
                piece = {"index": index, "function": {"arguments": arguments[i : i + size]}}
                events.append(event({"tool_calls": [piece]}))
        events.append(event({}, choice["finish_reason"]))
        if (request.get("stream_options") or {}).get("include_usage") and self.sends_usage:
            events.append({**base, "choices": [], "usage": completion["usage"]})
        self.streams += 1
        try:
            await response.prepare(http)
            for index, item in enumerate(events):
                if index == self.stream_hold_after:
                    self.stream_holding += 1
                    self._pulse()
                    await self.stream_release.wait()
                await response.write(f"data: {json.dumps(item)}\n\n".encode())
                self.stream_events += 1
                self._pulse()
                if self.stream_delay:
                    await asyncio.sleep(self.stream_delay)
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionResetError:  # the client went away: the generation ends here
            self.streams_cut += 1
            self._pulse()
        except asyncio.CancelledError:
            self.streams_cut += 1
            self._pulse()
            raise
        return response

    def _completion(self, request: JSON, step: Reply | ToolCalls) -> JSON:
        message: JSON = {"role": "assistant", "content": step.text, "refusal": None}
        produced = step.text or ""
        if isinstance(step, ToolCalls):
            calls = []
            for spec in step.calls:
                name, args, *given = spec
                call_id = given[0] if given else f"call_{next(self._ids)}"
                arguments = args if isinstance(args, str) else json.dumps(dict(args))
                produced += name + arguments
                calls.append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": arguments},
                    }
                )
            message["tool_calls"] = calls
        prompt = estimate_tokens(
            json.dumps(request.get("messages", []), ensure_ascii=False)
            + json.dumps(request.get("tools", []), ensure_ascii=False)
        )
        usage = {"prompt_tokens": prompt, "completion_tokens": estimate_tokens(produced)}
        usage.update(step.usage or {})
        usage.setdefault("total_tokens", usage["prompt_tokens"] + usage["completion_tokens"])
        completion = {
            "id": f"chatcmpl-fake{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.get("model") or self.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": step.finish_reason,
                }
            ],
            "usage": usage,
            "system_fingerprint": "fp_fake",
        }
        if not self.sends_usage:
            del completion["usage"]
        return completion


def _step_name(step: Step) -> str:
    return {
        Reply: "reply",
        ToolCalls: "tool_calls",
        HttpError: "error",
        Hang: "hang",
        Raw: "raw",
    }[type(step)]


def _json(
    payload: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.json_response(payload, status=status, headers=dict(headers or {}))


# -- request validation -------------------------------------------------------------------------


def _fail(where: str, problem: str) -> NoReturn:
    raise AssertionError(f"{where}: {problem}")


def _check_content(where: str, content: Any, *, allow_none: bool = False) -> None:
    if content is None:
        if not allow_none:
            _fail(where, "content is missing (null)")
        return
    if isinstance(content, str):
        return
    if not isinstance(content, list) or not content:
        _fail(where, f"content must be a string or a non-empty list of parts, got {content!r}")
    for i, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            _fail(f"{where}.content[{i}]", f"a content part needs a 'type', got {part!r}")
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            _fail(f"{where}.content[{i}]", "a text part needs its 'text'")
        if part["type"] == "image_url":
            url = (part.get("image_url") or {}).get("url")
            if not isinstance(url, str) or not re.match(
                r"(https?://|data:image/[a-z+.-]+;base64,)", url
            ):
                _fail(
                    f"{where}.content[{i}]",
                    f"an image part needs an http(s) or data URL, got {url!r:.80}",
                )


def _check_tool_calls(where: str, calls: Any, seen_ids: set[str]) -> list[str]:
    if not isinstance(calls, list) or not calls:
        _fail(where, f"tool_calls must be a non-empty list, got {calls!r}")
    ids: list[str] = []
    for i, call in enumerate(calls):
        at = f"{where}.tool_calls[{i}]"
        if not isinstance(call, dict):
            _fail(at, f"must be an object, got {call!r}")
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            _fail(at, f"id must be a non-empty string, got {call_id!r}")
        if call_id in seen_ids or call_id in ids:
            _fail(at, f"duplicate tool call id {call_id!r}")
        if call.get("type") != "function":
            _fail(at, f"type must be 'function', got {call.get('type')!r}")
        function = call.get("function")
        if not isinstance(function, dict):
            _fail(at, f"function must be an object, got {function!r}")
        name = function.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.match(name):  # as in ``tools``
            _fail(at, f"function.name must match {_TOOL_NAME.pattern}, got {name!r}")
        if not isinstance(function.get("arguments"), str):
            _fail(
                at,
                "function.arguments must be a string (JSON text), "
                f"got {type(function.get('arguments')).__name__}",
            )
        ids.append(call_id)
    return ids


def _check_tools(tools: Any) -> set[str]:
    from jsonschema import Draft202012Validator, SchemaError

    if not isinstance(tools, list) or not tools:
        _fail("tools", f"must be a non-empty list when present (the API rejects []), got {tools!r}")
    if len(tools) > MAX_TOOLS:
        _fail("tools", f"array too long: at most {MAX_TOOLS} tools, got {len(tools)}")
    names: set[str] = set()
    for i, tool in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            _fail(at, f"must be {{'type': 'function', 'function': ...}}, got {tool!r}")
        function = tool.get("function")
        if not isinstance(function, dict):
            _fail(at, f"function must be an object, got {function!r}")
        name = function.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            _fail(at, f"function.name must match {_TOOL_NAME.pattern}, got {name!r}")
        if name in names:
            _fail(at, f"duplicate tool name {name!r}")
        names.add(name)
        if not isinstance(function.get("description"), str) or not function["description"]:
            _fail(at, f"function.description must be a non-empty string ({name})")
        parameters = function.get("parameters")
        if not isinstance(parameters, dict) or parameters.get("type") != "object":
            _fail(at, f"function.parameters must be a JSON schema of type object ({name})")
        try:
            Draft202012Validator.check_schema(parameters)
        except SchemaError as exc:
            _fail(at, f"function.parameters is not a valid JSON schema ({name}): {exc.message}")
    return names


def assert_chat_shape(body: Any) -> None:
    """Check a chat-completions request body the way the API would; AssertionError if not.

    Beyond field types, it enforces the API's pairing rules: every tool message answers a
    tool call of the assistant message right before it (only tool messages in between),
    and every tool call of an assistant message is answered before anything else follows.
    """
    if not isinstance(body, dict):
        _fail("body", f"must be a JSON object, got {type(body).__name__}")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        _fail("model", f"must be a non-empty string, got {model!r}")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        _fail("messages", f"must be a non-empty list, got {messages!r}")
    if "stream_options" in body and not body.get("stream"):
        _fail("stream_options", "only allowed when stream is true")

    seen_ids: set[str] = set()
    open_calls: list[str] = []  # ids of the last assistant's calls not yet answered
    open_since: str | None = None
    in_tool_block = False
    for i, message in enumerate(messages):
        at = f"messages[{i}]"
        if not isinstance(message, dict):
            _fail(at, f"must be an object, got {message!r}")
        role = message.get("role")
        if role not in ROLES:
            _fail(at, f"role must be one of {sorted(ROLES)}, got {role!r}")
        if role != "tool":
            if open_calls:
                _fail(
                    at,
                    f"the assistant tool calls in {open_since} were not all answered before "
                    f"this {role} message; unanswered tool_call_ids: {open_calls}",
                )
            in_tool_block = False
        if role in ("system", "user"):
            _check_content(at, message.get("content"))
        elif role == "assistant":
            calls = message.get("tool_calls")
            if calls is None:
                _check_content(at, message.get("content"))
                continue
            _check_content(at, message.get("content"), allow_none=True)
            ids = _check_tool_calls(at, calls, seen_ids)
            seen_ids.update(ids)
            open_calls, open_since, in_tool_block = list(ids), at, True
        else:  # tool
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                _fail(at, f"a tool message needs a tool_call_id, got {call_id!r}")
            if call_id not in seen_ids:
                _fail(at, f"tool_call_id {call_id!r} matches no earlier assistant tool call")
            if not in_tool_block or call_id not in open_calls:
                _fail(
                    at,
                    f"tool message for {call_id!r} must directly follow the assistant message "
                    "with that tool call (tool messages may only be separated by other tool "
                    "messages), and answer it once",
                )
            open_calls.remove(call_id)
            _check_content(at, message.get("content"))
    if open_calls:
        _fail(
            "messages",
            f"the assistant tool calls in {open_since} are unanswered at the end: {open_calls}",
        )

    tool_names: set[str] = set()
    if "tools" in body:
        tool_names = _check_tools(body["tools"])
    if "tool_choice" in body:
        choice = body["tool_choice"]
        if "tools" not in body:
            _fail("tool_choice", "is only allowed when tools are specified")
        if isinstance(choice, str):
            if choice not in TOOL_CHOICES:
                _fail("tool_choice", f"must be one of {sorted(TOOL_CHOICES)}, got {choice!r}")
        elif isinstance(choice, dict):
            if choice.get("type") == "function":
                name = (choice.get("function") or {}).get("name")
                if name not in tool_names:
                    _fail("tool_choice", f"names function {name!r}, which is not in tools")
            elif not isinstance(choice.get("type"), str):
                _fail("tool_choice", f"an object tool_choice needs a 'type', got {choice!r}")
        else:
            _fail("tool_choice", f"must be a string or an object, got {choice!r}")
    if "temperature" in body:
        temperature = body["temperature"]
        if (
            not isinstance(temperature, int | float)
            or isinstance(temperature, bool)
            or not (0 <= temperature <= 2)
        ):
            _fail("temperature", f"must be a number in [0, 2], got {temperature!r}")
    for key in ("max_tokens", "max_completion_tokens"):
        if key in body:
            value = body[key]
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                _fail(key, f"must be a positive integer, got {value!r}")
