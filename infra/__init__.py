"""Package data of the local broker: its Maven POM and log4j2 configuration."""
