"""The IMAP watcher (``mailroom bridge imap``): new mail on the server becomes a poll at once.

``leases`` shares the accounts among watcher processes, ``account`` watches the folders of
one account (NOTIFY on one connection, or IDLE on one per folder), ``service`` runs them
and sends the polls (ARCHITECTURE.md, Intake: the IMAP watcher).
"""
