"""The transactional outbox: recognition requests written with their jobs, published to NATS by a relay."""
