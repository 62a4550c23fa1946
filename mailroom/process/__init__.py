"""What every Mailroom process shares: logging, observability, stop signals, identity, GC policy."""
