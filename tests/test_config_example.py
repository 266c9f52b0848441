"""config.example.toml is valid and documents every key of every section."""

from __future__ import annotations

import re
import tomllib

from pydantic import BaseModel

from echo_bot.config import Config, CronJob, McpServerConfig, WebhookRoute, parse_config
from echo_bot.plugins import registry
from tests.conftest import ROOT, echo_bot_env, run_echo_bot

EXAMPLE = ROOT / "config.example.toml"


def keys_of(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys += keys_of(annotation, f"{prefix}{name}.")
        else:
            keys.append(f"{prefix}{name}")
    return keys


def test_example_is_valid() -> None:
    parse_config(tomllib.loads(EXAMPLE.read_text()), str(EXAMPLE))
    result = run_echo_bot("check-config", "--config", str(EXAMPLE), env=echo_bot_env())
    assert result.returncode == 0, result.stderr


def test_example_documents_every_key() -> None:
    text = EXAMPLE.read_text()
    missing = []
    for key in (
        keys_of(Config)
        + [
            key
            for spec in registry().specs.values()
            if spec.config_model is not None and spec.target.startswith("channels.")  # built-in
            for key in keys_of(spec.config_model, f"{spec.name}.")
        ]
        + [f"webhook.routes.{k}" for k in WebhookRoute.model_fields]
        + [f"cron.{k}" for k in CronJob.model_fields]
        + [f"mcp.servers.{k}" for k in McpServerConfig.model_fields]
    ):
        name = key.rsplit(".", 1)[-1]
        if name in {"routes", "cron", "servers"}:
            continue
        if not re.search(rf"^#? ?{re.escape(name)} = ", text, re.M):
            missing.append(key)
    assert missing == []
