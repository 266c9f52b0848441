"""Chat commands: the registry every chat channel shares, and the core ones (/help,
/approvals, /reset, ...)."""
