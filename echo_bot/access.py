"""The core's AccessControl: configured allowlists plus users added by pairing.

Paired users are looked up in the store on every message, never cached, so
``echo-bot pairings revoke`` from another process shuts a user out at once."""

from __future__ import annotations

from .config import Config
from .store import Store


class StoreAccess:
    def __init__(self, store: Store, config: Config) -> None:
        self._store = store
        self.reload(config)

    def reload(self, config: Config) -> list[str]:
        """Take the configured allowlists (at start and on reload)."""
        self._configured = {
            "telegram": {str(u) for u in config.telegram.allowed_users},
            "matrix": set(config.matrix.allowed_users),
            "slack": set(config.slack.allowed_users),
        }
        return []

    async def is_allowed(self, channel: str, user_id: str) -> bool:
        if user_id in self._configured.get(channel, set()):
            return True
        return await self._store.run(lambda tx: tx.access.is_paired(channel, user_id))

    async def pair(self, channel: str, user_id: str, code: str) -> str:
        return await self._store.run(lambda tx: tx.access.try_pair(channel, user_id, code))

    async def pairing_open(self) -> bool:
        return await self._store.run(lambda tx: tx.access.pairing_open())
