"""Event schema, topics, codec, the bus, replay and the local broker."""
