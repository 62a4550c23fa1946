"""Data lifecycle: retention of mail bodies, legal hold and erasure of one mail.

``objects`` drops the rows of objects nothing refers to any more and queues their
deletion from the store; ``retention`` is the scheduler's pass; ``erase`` the
operator's commands (ARCHITECTURE.md, Retention and erasure).
"""
