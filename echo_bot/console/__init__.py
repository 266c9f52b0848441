"""The web console (docs/CONSOLE.md): approvers decide pending requests in a browser and
read the history, the audit log and the daemon's status.

``auth`` (links, sessions, who signed in) needs only the store and is what the CLI's
``echo-bot console`` and the ``/console`` chat command use; ``web`` (aiohttp handlers,
Jinja2 templates) is imported only when ``[console] enabled``.
"""
