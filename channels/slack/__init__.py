"""The Slack channel on slack-sdk: chat in direct messages and threads, approve with
Block Kit buttons, in Socket Mode or over HTTP.

The registry names ``channels.slack.channel:SlackChannel``; this package imports
nothing, so its ``settings`` (the ``[slack]`` section) is read without slack-sdk. One
module per job: ``channel`` (the wiring, the start's checks), ``transport`` (Socket Mode
or the Events API over HTTP: each delivery committed before it is acknowledged),
``inbound`` (events and button presses into InboundMessages), ``blocks`` (approval
prompts as Block Kit, and which buttons a prompt carries), ``outbound`` (send, edit,
files), ``web`` (the Web API, paced, its errors mapped), ``media`` (files people share),
``formatting`` (Markdown into mrkdwn) and ``doctor`` (what `echo-bot doctor` checks).
"""
