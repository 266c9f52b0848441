"""Where the files people send are kept: ``<workspace>/inbox/<sender>/<UTC date>/…``.

The sender's folder comes first so that a file's path says whose it is: the gate lets a
person who is not an approver have back the files *they* sent (their own folder) and
nothing else of the workspace, and the media budgets count bytes per sender from the
same folders. The folder name is an injective encoding of ``channel`` and sender id
(every character outside ``[A-Za-z0-9_-]`` becomes ``.xx`` per UTF-8 byte, and "-" in
the channel's part too, as it ends that part), so two senders never share a folder and
no name starts with a dot.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

INBOX = "inbox"
_ESCAPED = re.compile(r"[^A-Za-z0-9_-]")
_ESCAPED_CHANNEL = re.compile(r"[^A-Za-z0-9_]")  # "-" too: it ends the channel's part


def _encode(value: str, escaped: re.Pattern[str] = _ESCAPED) -> str:
    return escaped.sub(lambda m: "".join(f".{b:02x}" for b in m.group().encode()), value)


def sender_folder(channel: str, sender_id: str) -> str:
    """The inbox folder of one sender on one channel (``telegram-42``)."""
    return f"{_encode(channel, _ESCAPED_CHANNEL)}-{_encode(sender_id)}"


def sent_by(relative: PurePosixPath, channel: str, sender_id: str) -> bool:
    """Whether a workspace-relative path (already resolved, no ``..``) is a file in the
    inbox folder of this sender. A file of the inbox's older layout
    (``inbox/<date>/…``) names no sender, so it is nobody's but the owner's."""
    parts = relative.parts
    return len(parts) >= 3 and parts[0] == INBOX and parts[1] == sender_folder(channel, sender_id)
