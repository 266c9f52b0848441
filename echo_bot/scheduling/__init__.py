"""Everything about time: reminders (the service and its chat commands), cron jobs,
the scheduler that fires both, and parsing what people write ("in 10 minutes")."""
