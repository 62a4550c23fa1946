"""The Dramatiq broker: built from Settings, its transport, clock, outage handling and sending."""
