"""Examples that come with echo-bot, run as programs of their own (``python3 -m …``);
the daemon never imports them."""
