"""Writing and reading Kafka: the producer, the consume loops, out-of-order intake and its done
marks, requests once by identity, tails, replay, dead letters.
"""
