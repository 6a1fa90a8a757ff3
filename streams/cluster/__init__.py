"""The cluster: the local broker, topic administration, ACLs and credentials, settings, preflight
checks.
"""
