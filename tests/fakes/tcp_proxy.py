"""A TCP proxy on 127.0.0.1 in front of a channel's peer, to take the peer away as a
network outage does and bring it back.

``cut()`` resets every open connection and stops listening, so a new connection is
refused (what the daemon sees when the peer's host or the path to it goes down);
``restore()`` listens again on the same port. The peer itself (a fake, Synapse) keeps
running throughout: what people send meanwhile waits there, as it waits on the real
network's servers.

The port comes from ``tests.ports.free_port`` (below the ephemeral range), so no
outgoing connection on the machine takes it while the proxy is cut.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType
from typing import Self

from tests.ports import free_port

REBIND_FOR = 5.0  # seconds ``restore`` tries to listen again


class TcpProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.connections = 0  # accepted in all
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._pipes: set[asyncio.Task[None]] = set()

    @property
    def origin(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def up(self) -> bool:
        return self._server is not None

    async def __aenter__(self) -> Self:
        await self.restore()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.cut()

    async def cut(self) -> None:
        """The peer away: open connections reset, new ones refused."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._open):
            writer.transport.abort()
        self._open.clear()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def restore(self) -> None:
        """The peer back, on the same port."""
        if self._server is not None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REBIND_FOR
        while True:
            try:
                self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
                return
            except OSError:
                if loop.time() > deadline:
                    raise
                await asyncio.sleep(0.05)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._server is None:  # accepted as the proxy was cut
            writer.transport.abort()
            return
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._open.update((writer, up_writer))
        pipes = [
            asyncio.ensure_future(self._pipe(reader, up_writer)),
            asyncio.ensure_future(self._pipe(up_reader, writer)),
        ]
        self._pipes.update(pipes)
        try:
            await asyncio.gather(*pipes, return_exceptions=True)
        finally:
            self._pipes.difference_update(pipes)
            for end in (writer, up_writer):
                self._open.discard(end)
                end.transport.abort()

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        with contextlib.suppress(OSError, RuntimeError):
            if sink.can_write_eof():
                sink.write_eof()
