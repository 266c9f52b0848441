"""The core's AccessControl: configured allowlists plus users added by pairing.

Paired users are looked up in the store on every message, never cached, so
``echo-bot pairings revoke`` from another process shuts a user out at once."""

from __future__ import annotations

from .config import Config
from .store import Database
from .store.access import is_paired, try_pair


class StoreAccess:
    def __init__(self, db: Database, config: Config) -> None:
        self._db = db
        self.configure(config)

    def configure(self, config: Config) -> None:
        """Take the configured allowlists (at start and on reload)."""
        self._configured = {"telegram": {str(u) for u in config.telegram.allowed_users}}

    async def is_allowed(self, channel: str, user_id: str) -> bool:
        if user_id in self._configured.get(channel, set()):
            return True
        return await self._db.run(lambda db: is_paired(db, channel, user_id))

    async def pair(self, channel: str, user_id: str, code: str) -> str:
        return await self._db.run(lambda db: try_pair(db, channel, user_id, code))
