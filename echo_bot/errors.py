"""One error tree for echo-bot. Catch broadly only at task boundaries."""

from __future__ import annotations

# The exit status of a command whose output closed early (`| head`): 128 + SIGPIPE, as
# for Unix tools killed by that signal.
EXIT_OUTPUT_CLOSED = 141


class EchoBotError(Exception):
    """Root of every error echo-bot raises on purpose."""

    exit_code = 1


class ConfigError(EchoBotError):
    """The configuration is invalid. The message names the file, the key and the reason."""

    exit_code = 2


class StateLockedError(EchoBotError):
    """Another daemon holds the state directory."""

    exit_code = 2

    def __init__(self, state_dir: str, pid: int | None) -> None:
        holder = f"pid {pid}" if pid else "another process"
        super().__init__(
            f"state dir {state_dir} is in use by {holder}; "
            "stop it first or pass another --state-dir"
        )
        self.pid = pid


class StoreError(EchoBotError):
    """The store could not be opened or written."""

    exit_code = 2


class PeerAway(EchoBotError):
    """A channel's peer cannot be reached now, or failed on its side (a 5xx, no answer
    in time): tried again with a backoff, never a reason to stop (``echo_bot.link``).
    What the owner must fix (a refused token) is a ``ConfigError`` instead."""


class CommitFailed(EchoBotError):
    """The inbox did not take an inbound (the store is away or refused it): the channel
    acknowledges nothing, so its peer sends it again."""


class NoSchema(StoreError):
    """A management command found no echo-bot store where it looked (an empty
    database, no file): it changes nothing, and says that `echo-bot run` makes one."""

    exit_code = 1


class StoreUnavailable(StoreError):
    """The store cannot be reached now (PostgreSQL: the connection was lost or the
    server is down); nothing of the failed work was committed, and the same work may
    succeed once it is back."""


class LeaseLost(EchoBotError):
    """Another daemon on the shared store holds what this one was working on (it took a
    session over while this one was cut off): this one must stop at once."""


class ChannelError(EchoBotError):
    """A channel failed to deliver. ``retryable`` says whether trying again may help."""

    def __init__(self, message: str, *, retryable: bool = True, retry_after: float | None = None):
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after


class MediaUnavailable(ChannelError):
    """A message's file cannot be fetched, and trying again will not help (too big, its
    reference expired): the turn goes on with a note saying so."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


class MediaTooLarge(MediaUnavailable):
    """A file outgrew the most bytes the core let a channel fetch (``fetch_media``'s
    ``limit``: what is left of the media budgets)."""
