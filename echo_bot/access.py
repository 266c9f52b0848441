"""The core's AccessControl: configured allowlists plus users added by pairing.

Paired users are looked up in the store on every message, never cached, so
``echo-bot pairings revoke`` from another process shuts a user out at once."""

from __future__ import annotations

from .approvals.routing import ApproverDirectory
from .config import Config, channel_section
from .plugins import registry
from .store import Store


class StoreAccess:
    def __init__(self, store: Store, config: Config) -> None:
        self._store = store
        self.reload(config)

    def reload(self, config: Config) -> list[str]:
        """Take the configured allowlists (at start and on reload)."""
        self._configured: dict[str, set[str]] = {}
        for spec in registry().specs.values():
            section = channel_section(config, spec.name)
            if section is not None:
                self._configured[spec.name] = {str(u) for u in spec.allowed_users(section)}
        self._approvers = ApproverDirectory(config)
        return []

    def may_approve(self, channel: str, user_id: str) -> bool:
        return self._approvers.approves_on(channel, user_id)

    async def is_allowed(self, channel: str, user_id: str) -> bool:
        if user_id in self._configured.get(channel, set()):
            return True
        return await self._store.run(lambda tx: tx.access.is_paired(channel, user_id))

    async def pair(self, channel: str, user_id: str, code: str) -> str:
        return await self._store.run(lambda tx: tx.access.try_pair(channel, user_id, code))

    async def pairing_open(self) -> bool:
        return await self._store.run(lambda tx: tx.access.pairing_open())
