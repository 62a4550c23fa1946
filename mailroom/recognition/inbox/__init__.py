"""The idempotent inbox: acks and results from recognition services, applied to their jobs once."""
