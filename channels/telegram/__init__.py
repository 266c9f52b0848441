"""The Telegram channel on aiogram 3: chat with the agent, approve from a phone.

The registry names ``channels.telegram.channel:TelegramChannel``; this package imports
nothing, so its ``settings`` (the ``[telegram]`` section) is read without aiogram. The
rest follows aiogram's own seams: ``channel`` (the wiring), ``poller`` and ``webhook``
(updates in, committed before they are acknowledged), ``handlers`` (updates into
InboundMessages), ``outbound`` (send, edit, files), ``previews`` (drafts),
``media`` (files in messages), ``text`` (the renderer: entities).
"""
