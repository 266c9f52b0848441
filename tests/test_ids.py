"""Ids: 32 hex digits, time first (so they sort by creation), unguessable, never repeated —
also not by a forked child (no random bytes are buffered where a child could copy them)."""

from __future__ import annotations

import os
import re
import time

import pytest

from echo_bot.events import new_id

ID = re.compile(r"[0-9a-f]{32}")


def test_ids_are_hex_unique_and_sort_by_creation() -> None:
    first = [new_id() for _ in range(5000)]
    time.sleep(0.002)
    later = new_id()
    assert all(ID.fullmatch(i) for i in first)
    assert len(set(first)) == len(first)
    assert max(first) < later  # a later millisecond sorts after
    assert int(later[:12], 16) == pytest.approx(time.time() * 1000, abs=5000)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_repeat_its_parents_random_bytes() -> None:
    new_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.write(write, "".join(new_id()[12:] for _ in range(20)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as pipe:
        child = pipe.read()
    parent = "".join(new_id()[12:] for _ in range(20))
    assert len(child) == len(parent) == 400
    assert child != parent
