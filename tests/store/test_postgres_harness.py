"""The PostgreSQL test harness says why it cannot use the server: a refused login is not
an unreachable server (the fix differs: the URL's password, or starting the server)."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.postgres import admin_url, reachable_admin_url


def test_a_refused_password_is_said_as_such_not_as_unreachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reachable_admin_url()  # the server answers (else this test skips, or fails in CI)
    parts = urlsplit(admin_url())
    wrong = parts._replace(
        netloc=f"{parts.username}:not-the-password@{parts.hostname}:{parts.port}"
    )
    monkeypatch.setenv("ECHO_BOT_TEST_POSTGRES", urlunsplit(wrong))
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception) as skipped:
        reachable_admin_url()
    assert "refused the login" in str(skipped.value), skipped.value
    assert "not reachable" not in str(skipped.value)
