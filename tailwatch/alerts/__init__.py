"""Alert delivery: Alertmanager v2 API with an in-order, retried outbox."""
