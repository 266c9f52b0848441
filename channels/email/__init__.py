"""The e-mail channel: IMAP for mail in, SMTP for mail out. Imports nothing here, so
``[email]`` can be read without the channel's libraries (``settings.py``)."""
