"""A setup with no chat that can approve (webhooks only, no Telegram): a risky call is
still a durable request, shown and decided by `echo-bot approvals`, and check-config
says so. A real daemon, real signed deliveries (`echo-bot webhook send`)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.conftest import echo_bot_env, run_echo_bot
from tests.proc import daemon_process

SECRET = "deploy-bearer-secret-value"
ENV = {"DEPLOY_SECRET": SECRET}
CONFIG = """
[http]
port = 0
[tools]
profile = "coding"
[tools.shell]
enabled = true
[approvals]
timeout = "1h"
[webhook]
enabled = true

[[webhook.routes]]
name = "deploy"
auth = "bearer"
secret_env = "DEPLOY_SECRET"
tool = "shell_exec"
args = { argv = ["sh", "-c", "echo ran >> count.txt"] }
"""


def echo_bot(*args: str, config: Path, state: Path) -> tuple[int, str]:
    done = run_echo_bot(
        *args, "--config", str(config), "--state-dir", str(state), env=echo_bot_env(**ENV)
    )
    return done.returncode, done.stdout + done.stderr


def pending_line(config: Path, state: Path, deadline: float = 30) -> str:
    """The one line of `echo-bot approvals list`, once the daemon has made the request."""
    end = time.monotonic() + deadline
    while True:
        code, out = echo_bot("approvals", "list", config=config, state=state)
        assert code == 0, out
        if out.strip() != "No approvals are pending.":
            (line,) = out.splitlines()
            return line
        audit = echo_bot("audit", config=config, state=state)[1]
        assert time.monotonic() < end, f"no request was made:\n{audit}"
        time.sleep(0.1)


def runs(state: Path) -> int:
    path = state / "workspace" / "count.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_check_config_says_prompts_wait_for_echo_bot_approvals(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(CONFIG)
    code, out = echo_bot("check-config", config=config, state=tmp_path / "st")
    assert code == 0, out
    assert (
        "approval prompts: in the requester's own chat when they approve there; others' go"
        " to echo-bot approvals (no [approvals] default_chat)"
    ) in out
    assert "  webhook route deploy: echo-bot approvals (no [approvals] default_chat)" in out


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
def test_webhook_only_setup_waits_for_echo_bot_approvals_and_runs_once_approved(
    tmp_path: Path,
) -> None:
    data = tmp_path / "payload.json"
    data.write_text('{"ref": "main"}')
    with daemon_process(tmp_path, CONFIG, ENV) as (config, state, _port):
        code, out = echo_bot("webhook", "send", "deploy", "--data", str(data),
                             config=config, state=state)  # fmt: skip
        assert code == 0 and out.startswith("HTTP 202"), out
        delivery = re.search(r'"id": "([0-9a-f]+)"', out)
        assert delivery, out

        line = pending_line(config, state)
        request = line.split()[0]
        assert "shell_exec (dangerous)" in line and "in webhook:deploy" in line
        assert "prompt in no chat (it waits for echo-bot approvals approve|deny)" in line
        code, out = echo_bot("approvals", "show", request, config=config, state=state)
        assert "prompt in: no chat (it waits for echo-bot approvals approve|deny)" in out
        code, out = echo_bot("webhook", "deliveries", config=config, state=state)
        assert f"waits for: echo-bot approvals approve {request}" in out, out
        assert runs(state) == 0

        code, out = echo_bot("approvals", "approve", request, config=config, state=state)
        assert code == 0 and f"Approved: {request}" in out, out
        end = time.monotonic() + 30
        while "done" not in echo_bot("webhook", "deliveries", config=config, state=state)[1]:
            assert time.monotonic() < end, "the delivery did not finish"
            time.sleep(0.1)
        assert runs(state) == 1

        # A second delivery (another body: the same one would be a duplicate), denied.
        data.write_text('{"ref": "next"}')
        code, out = echo_bot("webhook", "send", "deploy", "--data", str(data),
                             config=config, state=state)  # fmt: skip
        assert code == 0 and out.startswith("HTTP 202"), out
        second = pending_line(config, state).split()[0]
        code, out = echo_bot("approvals", "deny", second, config=config, state=state)
        assert code == 0 and f"Denied: {second}" in out, out
        code, out = echo_bot("approvals", "list", config=config, state=state)
        assert out.strip() == "No approvals are pending."
    assert runs(state) == 1
