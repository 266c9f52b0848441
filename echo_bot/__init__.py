"""echo-bot: a self-hosted multi-channel bot host (the core).

The core never imports ``channels``; channels import only the public core API:
``echo_bot.events``, ``echo_bot.bus``, ``echo_bot.config`` and ``echo_bot.errors``.
"""

__version__ = "0.1.0"
