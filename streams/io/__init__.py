"""Writing and reading Kafka: the producer, the consume loops, out-of-order intake and its done
marks, requests once by identity, tails (of records or of keys), watches for jobs, replay, dead
letters.
"""
