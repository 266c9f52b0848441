"""Files that arrive with messages: fetched during the turn, saved, transcribed."""
