"""Operator views: what needs a person, and the gauges that count it."""
