"""Channel adapters. Each imports only echo_bot's public API (events, bus, config, errors)."""
