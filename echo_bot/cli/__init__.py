"""The echo-bot command: its parser and entry point (main), the management commands
that run beside a daemon (admin), doctor, and signing test webhook deliveries."""
