"""What every service shares: logging, heartbeats, shutdown, supervision, watchdogs, retries,
config files, run status, faust apps.
"""
