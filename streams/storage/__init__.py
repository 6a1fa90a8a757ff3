"""Object storage beside Kafka: claim checks, sharded stores, reading published weights, fitting
state dicts.
"""
