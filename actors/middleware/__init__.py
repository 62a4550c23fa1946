"""Dramatiq middleware: retry policy, dead letters, Sentry tags, log context, resources, maintenance."""
