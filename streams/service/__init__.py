"""What every service shares: logging, heartbeats, shutdown, supervision, a job's child
processes, watchdogs, retries, config files, run status, faust apps.
"""
