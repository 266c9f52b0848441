"""The tool registry: declarations checked, arguments validated, failures contained."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from echo_bot.errors import ConfigError
from echo_bot.events import Address, Sender
from echo_bot.tools.base import ErrorCode, Risk, Tool, ToolContext, ToolGroup, ToolResult
from echo_bot.tools.registry import ToolRegistry

OBJECT: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


@pytest.fixture
def ctx() -> ToolContext:
    return ToolContext(
        trace_id="t",
        session_key="cli:local",
        origin=Address(channel="cli", chat_id="local"),
        user=Sender(id="owner"),
    )


def make_tool(
    tool_name: str,
    *,
    run: Any = None,
    parameters: Any = None,
    group: ToolGroup = "basic",
    risk: Risk = Risk.READ,
    idempotent: bool = False,
    retries: int = 0,
    timeout: float = 30.0,
    available: bool = True,
) -> Tool:
    async def default_run(self: Tool, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return ToolResult.success(f"{tool_name} ran with {sorted(args)}")

    attrs: dict[str, Any] = {
        "name": tool_name,
        "description": f"the {tool_name} tool",
        "parameters": OBJECT if parameters is None else parameters,
        "group": group,
        "risk": risk,
        "idempotent": idempotent,
        "retries": retries,
        "timeout": timeout,
        "run": run or default_run,
        "available": lambda self: available,
    }
    cls = type(f"Tool_{tool_name}", (Tool,), attrs)
    return cls()  # type: ignore[no-any-return]


# --------------------------------------------------------------------------- register


@pytest.mark.parametrize(
    ("parameters", "reason"),
    [
        ({"type": "object", "properties": {"a": {"type": "nonsense"}}}, "invalid parameter schema"),
        ({"type": "object", "required": "a"}, "invalid parameter schema"),
        ({"type": "string"}, "must be a JSON-Schema object"),
        ({"properties": {"a": {"type": "string"}}}, "must be a JSON-Schema object"),
        ([{"type": "object"}], "invalid parameter schema"),
        (True, "must be a JSON-Schema object"),
    ],
)
def test_register_rejects_bad_schemas(parameters: Any, reason: str) -> None:
    registry = ToolRegistry()
    with pytest.raises(ValueError, match=reason) as info:
        registry.register(make_tool("bad", parameters=parameters))
    assert "'bad'" in str(info.value)
    assert registry.names() == []


def test_a_schema_nested_past_the_interpreters_limit_is_a_clear_value_error() -> None:
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(2000):  # check_schema recurses once a level and more: RecursionError
        deep = {"not": deep}
    registry = ToolRegistry()
    with pytest.raises(ValueError, match="nests too deeply") as info:
        registry.register(
            make_tool("deep", parameters={"type": "object", "properties": {"a": deep}})
        )
    assert "'deep'" in str(info.value)
    assert registry.names() == []


def test_register_rejects_duplicate_names() -> None:
    registry = ToolRegistry()
    registry.register(make_tool("same"))
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(make_tool("same"))
    assert registry.names() == ["same"]


def test_register_rejects_retries_on_non_idempotent_tool() -> None:
    registry = ToolRegistry()
    with pytest.raises(ValueError, match="only allowed for idempotent"):
        registry.register(make_tool("writer", retries=2, idempotent=False))
    registry.register(make_tool("reader", retries=2, idempotent=True))
    assert registry.names() == ["reader"]


def test_check_names_names_the_key_and_the_unknown_tool() -> None:
    registry = ToolRegistry()
    registry.register(make_tool("alpha"))
    registry.check_names(["alpha"], "tools.allow", "c.toml")
    with pytest.raises(ConfigError) as info:
        registry.check_names(["alpha", "omega"], "tools.allow", "c.toml")
    assert str(info.value).startswith("c.toml: tools.allow: unknown tool(s) omega")
    assert "alpha" in str(info.value)  # the known ones are listed


# --------------------------------------------------------------------------- execute


async def test_unknown_tool_suggests_close_names(ctx: ToolContext) -> None:
    registry = ToolRegistry()
    for name in ("current_time", "file_read", "file_write"):
        registry.register(make_tool(name))
    result = await registry.execute("curent_time", {}, ctx)
    assert not result.ok and result.error_code is ErrorCode.TOOL_NOT_FOUND
    assert "curent_time" in result.output
    assert "Did you mean: current_time" in result.output
    assert result.data["closest"][0] == "current_time"


async def test_unknown_tool_without_close_names(ctx: ToolContext) -> None:
    registry = ToolRegistry()
    registry.register(make_tool("current_time"))
    result = await registry.execute("zzzzzz", {}, ctx)
    assert result.error_code is ErrorCode.TOOL_NOT_FOUND
    assert "Did you mean" not in result.output


@pytest.mark.parametrize("args", [[1, 2], "text", None, 5])
async def test_arguments_must_be_an_object(ctx: ToolContext, args: Any) -> None:
    registry = ToolRegistry()
    registry.register(make_tool("t"))
    result = await registry.execute("t", args, ctx)
    assert result.error_code is ErrorCode.INVALID_PARAMETER
    assert "must be a JSON object" in result.output


async def test_schema_violation_lists_the_problem_paths(ctx: ToolContext) -> None:
    registry = ToolRegistry()
    schema = {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "options": {
                "type": "object",
                "properties": {"depth": {"type": "integer", "minimum": 0}},
            },
        },
        "required": ["path"],
        "additionalProperties": False,
    }
    ran: list[dict[str, Any]] = []

    async def run(self: Tool, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        ran.append(args)
        return ToolResult.success("ran")

    registry.register(make_tool("lister", parameters=schema, run=run))
    result = await registry.execute("lister", {"path": 3, "options": {"depth": -1}}, ctx)
    assert result.error_code is ErrorCode.INVALID_PARAMETER
    assert "invalid arguments for lister" in result.output
    assert "path: 3 is not of type 'string'" in result.output
    assert "options/depth: -1 is less than the minimum of 0" in result.output
    missing = await registry.execute("lister", {"extra": 1}, ctx)
    assert missing.error_code is ErrorCode.INVALID_PARAMETER
    assert "(arguments): 'path' is a required property" in missing.output
    assert "extra" in missing.output  # additionalProperties
    assert ran == []  # never run with bad arguments
    ok = await registry.execute("lister", {"path": "x", "options": {"depth": 2}}, ctx)
    assert ok.ok and ran == [{"path": "x", "options": {"depth": 2}}]


async def test_exception_in_run_is_a_tool_error(ctx: ToolContext) -> None:
    async def run(self: Tool, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        raise KeyError("boom")

    registry = ToolRegistry()
    registry.register(make_tool("explodes", run=run))
    result = await registry.execute("explodes", {}, ctx)
    assert not result.ok and result.error_code is ErrorCode.TOOL_ERROR
    assert "explodes failed: KeyError" in result.output and "boom" in result.output


async def test_timeout_is_reported(ctx: ToolContext) -> None:
    async def run(self: Tool, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        await asyncio.Event().wait()  # never finishes
        raise AssertionError("unreachable")

    registry = ToolRegistry()
    registry.register(make_tool("hangs", run=run, timeout=0.05))
    result = await registry.execute("hangs", {}, ctx)
    assert result.error_code is ErrorCode.TIMEOUT
    assert "hangs did not finish within 0.05 s" in result.output


@pytest.mark.parametrize("returned", [None, "just text", {"ok": True}])
async def test_non_tool_result_return_is_a_tool_error(ctx: ToolContext, returned: Any) -> None:
    async def run(self: Tool, args: dict[str, Any], ctx: ToolContext) -> Any:
        return returned

    registry = ToolRegistry()
    registry.register(make_tool("sloppy", run=run))
    result = await registry.execute("sloppy", {}, ctx)
    assert result.error_code is ErrorCode.TOOL_ERROR
    assert f"sloppy returned {type(returned).__name__}" in result.output


async def test_sync_run_is_a_tool_error(ctx: ToolContext) -> None:
    def run(self: Tool, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return ToolResult.success("not awaitable")

    registry = ToolRegistry()
    registry.register(make_tool("sync", run=run))
    result = await registry.execute("sync", {}, ctx)
    assert result.error_code is ErrorCode.TOOL_ERROR


async def test_idempotent_tool_is_retried_on_upstream_errors(ctx: ToolContext) -> None:
    attempts: list[int] = []

    async def run(self: Tool, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        attempts.append(1)
        if len(attempts) <= 2:
            return ToolResult.failure(ErrorCode.UPSTREAM_ERROR, "502 from upstream")
        return ToolResult.success("finally")

    registry = ToolRegistry()
    registry.register(make_tool("flaky", run=run, idempotent=True, retries=2))
    result = await registry.execute("flaky", {}, ctx)
    assert result.ok and result.output == "finally"
    assert len(attempts) == 3
    assert result.latency_ms > 0


async def test_retries_are_bounded(ctx: ToolContext) -> None:
    attempts: list[int] = []

    async def run(self: Tool, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        attempts.append(1)
        return ToolResult.failure(ErrorCode.UPSTREAM_ERROR, "down")

    registry = ToolRegistry()
    registry.register(make_tool("down", run=run, idempotent=True, retries=1))
    result = await registry.execute("down", {}, ctx)
    assert result.error_code is ErrorCode.UPSTREAM_ERROR and len(attempts) == 2


async def test_other_failures_and_non_idempotent_tools_are_not_retried(ctx: ToolContext) -> None:
    calls: dict[str, int] = {"bad": 0, "once": 0}

    async def bad(self: Tool, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        calls["bad"] += 1
        return ToolResult.failure(ErrorCode.NOT_FOUND, "no such thing")

    async def once(self: Tool, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        calls["once"] += 1
        return ToolResult.failure(ErrorCode.UPSTREAM_ERROR, "down")

    registry = ToolRegistry()
    registry.register(make_tool("bad", run=bad, idempotent=True, retries=3))
    registry.register(make_tool("once", run=once, idempotent=False))
    assert (await registry.execute("bad", {}, ctx)).error_code is ErrorCode.NOT_FOUND
    assert (await registry.execute("once", {}, ctx)).error_code is ErrorCode.UPSTREAM_ERROR
    assert calls == {"bad": 1, "once": 1}


async def test_switched_off_tool_is_refused(ctx: ToolContext) -> None:
    registry = ToolRegistry()
    registry.register(make_tool("off", available=False))
    result = await registry.execute("off", {}, ctx)
    assert result.error_code is ErrorCode.PERMISSION_DENIED
    assert "switched off" in result.output


# --------------------------------------------------------------------------- for_model


def test_for_model_truncates_long_output_and_says_so() -> None:
    registry = ToolRegistry(output_limit=1000)
    text = "x" * 1000 + "TAIL" * 100
    shown = registry.for_model(ToolResult.success(text), "call-7")
    assert shown.startswith("x" * 1000)
    assert "TAIL" not in shown
    assert "400 more characters truncated" in shown
    assert "call-7" in shown


def test_for_model_keeps_short_output_unchanged() -> None:
    registry = ToolRegistry(output_limit=1000)
    text = "y" * 1000
    assert registry.for_model(ToolResult.success(text), "c") == text


# --------------------------------------------------------------------------- exposed


@pytest.fixture
def stocked() -> ToolRegistry:
    registry = ToolRegistry()
    registry.register(make_tool("clock", group="basic"))
    registry.register(make_tool("send", group="messaging", risk=Risk.WRITE))
    registry.register(make_tool("read_file", group="coding"))
    registry.register(make_tool("shell", group="coding", risk=Risk.DANGEROUS, available=False))
    registry.register(make_tool("browser", group="extra"))
    return registry


def exposed_names(registry: ToolRegistry, profile: str, **kw: Any) -> list[str]:
    return sorted(t.name for t in registry.exposed(profile, **kw))


def test_profiles_expose_their_groups(stocked: ToolRegistry) -> None:
    assert exposed_names(stocked, "minimal") == ["clock"]
    assert exposed_names(stocked, "messaging") == ["clock", "send"]
    assert exposed_names(stocked, "coding") == ["clock", "read_file", "send"]
    assert exposed_names(stocked, "full") == ["browser", "clock", "read_file", "send"]


def test_deny_removes_and_allow_adds(stocked: ToolRegistry) -> None:
    assert exposed_names(stocked, "messaging", deny=["send"]) == ["clock"]
    assert exposed_names(stocked, "minimal", allow=["read_file"]) == ["clock", "read_file"]
    # deny wins over allow
    assert exposed_names(stocked, "minimal", allow=["read_file"], deny=["read_file"]) == ["clock"]


def test_unavailable_tool_is_never_exposed(stocked: ToolRegistry) -> None:
    assert "shell" not in exposed_names(stocked, "full")
    assert "shell" not in exposed_names(stocked, "coding", allow=["shell"])
    assert "shell" not in exposed_names(stocked, "minimal", allow=["shell"])


def test_builtin_minimal_profile_is_read_only(tmp_path: Any) -> None:
    from echo_bot.config import ShellToolConfig, ToolsConfig
    from echo_bot.tools.builtin import builtin_tools

    registry = ToolRegistry()
    config = ToolsConfig(shell=ShellToolConfig(enabled=True))
    for tool in builtin_tools(config, workspace=tmp_path, timezone="UTC"):
        registry.register(tool)
    minimal = registry.exposed("minimal")
    assert minimal and all(t.risk is Risk.READ and t.group == "basic" for t in minimal)
    assert "shell_exec" not in [t.name for t in minimal]
    assert "shell_exec" in [t.name for t in registry.exposed("coding")]  # enabled: exposed


# ------------------------------------------------------------ remembered valid arguments


def test_remembered_valid_arguments_never_let_a_different_value_through() -> None:
    """Valid arguments are remembered (a call is checked when settled and again when it
    runs); what is remembered must not stand for a value the schema would refuse: a
    tuple is not a JSON array, True is not an integer, and a changed value is checked
    again."""
    parameters = {
        "type": "object",
        "properties": {"ids": {"type": "array"}, "n": {"type": "integer"}},
        "additionalProperties": False,
    }
    registry = ToolRegistry()
    registry.register(make_tool("pick", parameters=parameters))
    for _ in range(2):  # checked, then remembered
        assert registry.validate("pick", {"ids": [1, 2], "n": 1}) is None
    for refused in ({"ids": (1, 2), "n": 1}, {"ids": [1, 2], "n": True}, {"ids": [1], "n": "1"}):
        for _ in range(2):  # refused each time, with its reason
            invalid = registry.validate("pick", refused)
            assert invalid is not None and invalid.error_code == ErrorCode.INVALID_PARAMETER
    assert registry.validate("pick", {"ids": [1, 2], "n": 1.5}) is not None


def test_remembered_arguments_are_per_tool() -> None:
    registry = ToolRegistry()
    registry.register(make_tool("loose", parameters={"type": "object"}))
    registry.register(make_tool("strict"))  # no properties allowed
    assert registry.validate("loose", {"x": 1}) is None
    assert registry.validate("strict", {"x": 1}) is not None
