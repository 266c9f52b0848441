"""The Discord channel (``[discord]``), on discord.py over the gateway: direct messages,
and in guild channels a mention of the bot or a reply to it (a thread is a conversation
of its own); approvals as buttons. Imported only when ``[discord]`` is enabled: the
``discord`` extra installs discord.py."""
