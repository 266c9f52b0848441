"""The Matrix channel on matrix-nio: chat and approve from Element, encrypted rooms too.

The registry names ``channels.matrix.channel:MatrixChannel``; this package imports
nothing, so its ``settings`` (the ``[matrix]`` section) is read without nio. One module
per job: ``session`` (login, the device and its encryption keys in
``<state_dir>/matrix/``), ``sync`` (the durable sync loop: events committed before the
sync token moves past them), ``inbound`` (events into InboundMessages, invites,
undecryptable messages; reactions and replies to prompts handed to the edge),
``media`` (files both ways through the media repository), ``outbound`` (post, edit and
redact one event for the host's ``ChatSends``; prompts, files, rate limits),
``formatting`` (the renderer: body and HTML) and ``doctor``.
"""
