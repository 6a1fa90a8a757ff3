"""What crosses Kafka: event kinds, topic specs, the codec and packed arrays, the schema export."""
