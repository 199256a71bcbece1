"""The discrete-event engine: program IR, schedules, collectives, engines and outputs."""
