"""Mailboxes, channel accounts and notification routes kept in Postgres (``runtime_config``).

``secrets`` turns a settings model into stored JSON (secrets Fernet-encrypted) and back;
``rows`` reads and writes the table; ``effective`` gives each reader the environment's
entries overlaid by the table's (ARCHITECTURE.md, Runtime configuration).
"""
