"""One error tree: every exception echo-bot defines derives from ``EchoBotError``."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import channels
import echo_bot
from echo_bot.errors import EchoBotError

# Exceptions that must not derive from EchoBotError, each with the reason. Empty today:
# one that must also be something else (``AddressRefused`` is an OSError, so aiohttp
# wraps it as a connection error) derives from both.
ALLOWED_OUTSIDE: dict[str, str] = {}

# Modules that run something when imported.
NOT_IMPORTED = {"echo_bot.__main__"}


def _modules(package: ModuleType) -> list[ModuleType]:
    found = [package]
    for info in pkgutil.walk_packages(package.__path__, prefix=package.__name__ + "."):
        if info.name not in NOT_IMPORTED:
            found.append(importlib.import_module(info.name))
    return found


def _exceptions() -> dict[str, type[BaseException]]:
    classes: dict[str, type[BaseException]] = {}
    for module in _modules(echo_bot) + _modules(channels):
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
            ):
                classes[f"{module.__name__}.{value.__qualname__}"] = value
    return classes


def test_every_exception_derives_from_echo_bot_error() -> None:
    classes = _exceptions()
    assert "echo_bot.errors.EchoBotError" in classes  # the walk found the modules
    assert "channels.webhook_template.TemplateRefused" in classes
    outside = sorted(
        name
        for name, cls in classes.items()
        if not issubclass(cls, EchoBotError) and name not in ALLOWED_OUTSIDE
    )
    assert outside == [], f"exceptions outside EchoBotError: {outside}"


def test_the_allow_list_names_only_exceptions_that_exist_outside_the_tree() -> None:
    classes = _exceptions()
    for name in ALLOWED_OUTSIDE:
        assert name in classes, f"{name} is allowed outside EchoBotError but not defined"
        assert not issubclass(classes[name], EchoBotError), f"{name} is in the tree now"
