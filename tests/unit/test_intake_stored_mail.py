"""The stored mail leaves out the bodies of parts refused for their size, and says so."""

from __future__ import annotations

import base64
import email
import hashlib
import random
import re
from dataclasses import replace
from email import policy

from mailroom.intake.parsing import Limits, parse_mail
from mailroom.intake.stored_mail import REMOVED_HEADER, stored_mail
from tests.fixtures.imap import make_mail

LIMITS = Limits(max_attachment_bytes=1000, max_mail_bytes=50_000_000, max_attachments=10)
CSV = b"a,b\n1,2\n"


def _stored(raw: bytes, limits: Limits = LIMITS) -> bytes | None:
    return stored_mail(raw, parse_mail(raw, limits).attachments)


def _parts(raw: bytes) -> list[email.message.Message]:
    message = email.message_from_bytes(raw, policy=policy.compat32)
    return [p for p in message.walk() if not p.is_multipart()]


def test_the_body_of_a_part_over_the_limit_is_replaced_by_a_header_with_its_size_and_hash():
    scan = b"%PDF-1.7\n" + random.Random(1).randbytes(5000)
    raw = make_mail(
        1, attachments=[("scan.pdf", "application/pdf", scan), ("r.csv", "text/csv", CSV)]
    )
    stored = _stored(raw)
    assert stored is not None and len(stored) < len(raw) - 6000
    body, removed, rates = _parts(stored)
    assert removed.get_filename() == "scan.pdf" and removed.get_payload() == ""
    marker = removed[REMOVED_HEADER]
    size, digest = re.fullmatch(
        r"body of (\d+) bytes over the attachment limit; sha256=([0-9a-f]{64})", marker
    ).groups()
    encoded = raw[raw.index(base64.encodebytes(scan)[:76]) :][: int(size)]
    assert hashlib.sha256(encoded).hexdigest() == digest
    assert base64.b64decode(encoded) == scan
    assert rates.get_payload(decode=True) == CSV and body.get_payload(decode=True)
    # Outside the removed body the mail is byte for byte as received.
    cut = stored.index(REMOVED_HEADER.encode())
    assert stored[:cut] == raw[:cut]


def test_a_big_mails_refused_part_is_cut_from_the_raw_bytes_too():
    scan = b"%PDF-1.7\n" + random.Random(2).randbytes(3_000_000)
    raw = make_mail(
        2, attachments=[("scan.pdf", "application/pdf", scan), ("r.csv", "text/csv", CSV)]
    )
    stored = _stored(raw, replace(LIMITS, max_attachment_bytes=1_000_000))
    assert stored is not None and len(stored) < 10_000
    again = parse_mail(stored, replace(LIMITS, max_attachment_bytes=1_000_000))
    assert [(a.name, a.size, a.data) for a in again.attachments] == [
        ("scan.pdf", 0, b""),
        ("r.csv", len(CSV), CSV),
    ]


def test_a_mail_with_nothing_refused_is_stored_as_received():
    raw = make_mail(3, attachments=[("r.csv", "text/csv", CSV)])
    assert _stored(raw) is None
    # A part refused for the count, not its size, keeps its body: it costs nothing much.
    many = make_mail(4, attachments=[(f"{i}.csv", "text/csv", CSV) for i in range(3)])
    assert _stored(many, replace(LIMITS, max_attachments=1)) is None


def test_the_same_attachment_twice_is_removed_twice():
    scan = random.Random(3).randbytes(3000)
    raw = make_mail(5, attachments=[("a.bin", "application/pdf", scan)] * 2)
    stored = _stored(raw)
    assert stored.count(REMOVED_HEADER.encode()) == 2
    assert len(stored) < len(raw) - 2 * 3000
