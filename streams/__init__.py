"""The event bus, by role: wire (events, topics, encoding), io (producing, consuming, replaying),
cluster (broker, admin, ACLs, settings), storage (claim checks, weights), service (what every
service shares: logs, heartbeats, supervision).
"""
