"""Queue names, by workload: ops scale each with its own worker processes and threads."""

#: ``poll_mailbox``: IMAP reads, one lease per mailbox.
INTAKE = "intake"
#: ``publish_recognition_requests``: the transactional outbox relay to NATS.
OUTBOX = "outbox"
#: ``apply_recognition_messages``: acks and results from recognition services.
INBOX = "inbox"
#: ``map_recognition_results`` (and ``map_recognition_result``): result files into documents;
#: ``notify_final_mails``: notifications of mails made final.
MAPPING = "mapping"
#: ``deliver_channel_message``: outbound notifications.
DELIVERY = "delivery"
#: Periodic sweeps the scheduler sends (watchdog, stale recovery, re-adds).
MAINTENANCE = "maintenance"
#: No-op and broker upkeep.
SYSTEM = "system"

ALL = (INTAKE, OUTBOX, INBOX, MAPPING, DELIVERY, MAINTENANCE, SYSTEM)
