"""Event schema, topic specs, codec, the bus (producer/consumer loops), replay and the local broker."""
