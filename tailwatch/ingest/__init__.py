"""The wire contract and every producer of events: simulator, replay, NVML collector, Kafka producer."""
