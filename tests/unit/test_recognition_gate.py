"""When the health gate closes for silence, and the reference recognizer's refusal of real mail."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

from mailroom.adapters.nats.backlog import InboxBacklog, backlog_of
from mailroom.db.migrate import PROJECT_ROOT
from mailroom.recognition.gate import UNREAD_REASON, gate_lines, silence_reason, unread_reason
from mailroom.recognizer.pairing import real_mailbox_refusal
from mailroom.settings import Settings

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
MAILBOX = {"name": "billing", "host": "imap.corp", "username": "u", "password": "p"}


def _reason(*, unacked_s=None, ack_s=None, result_s=None):
    def ago(seconds):
        return None if seconds is None else NOW - timedelta(seconds=seconds)

    return silence_reason(
        "tabular",
        oldest_unacked=ago(unacked_s),
        last_ack=ago(ack_s),
        last_result=ago(result_s),
        now=NOW,
        silence_after_s=60,
    )


def test_gate_stays_open_without_a_request_waiting_as_long_as_the_silence():
    assert _reason() is None
    assert _reason(unacked_s=59) is None


def test_gate_stays_open_while_a_service_answered_within_the_silence():
    assert _reason(unacked_s=600, ack_s=59) is None
    assert _reason(unacked_s=600, ack_s=900, result_s=10) is None


def test_gate_closes_when_a_request_waited_and_no_service_answered_as_long():
    assert "answered for 60 s" in (_reason(unacked_s=60) or "")
    reason = _reason(unacked_s=600, ack_s=61, result_s=300)
    assert reason is not None and "last answer 2030-01-01 11:58:59" in reason
    assert "none ever" in (_reason(unacked_s=61) or "")


def test_status_line_says_since_when_why_and_that_jobs_wait():
    gate = {"pipeline": "image", "closed_at": NOW.isoformat(), "reason": "NATS unreachable: x"}
    (line,) = gate_lines([gate])
    assert line.startswith("Recognition of image held since 2030-01-01T12:00:00: NATS")
    assert "no dlq" in line and gate_lines([]) == []


def test_answers_waiting_with_no_bridge_pulling_for_the_ack_wait_close_every_gate():
    reason = unread_reason(InboxBacklog(waiting=7, idle_s=31, pulls=0), idle_after_s=30)
    assert reason == f"{UNREAD_REASON} (7 answers wait in JetStream)"


def test_answers_a_bridge_reads_or_may_still_read_keep_the_gates_open():
    def reason(waiting, idle_s, pulls=0):
        return unread_reason(InboxBacklog(waiting, idle_s, pulls), idle_after_s=30)

    assert reason(0, 3600) is None  # nothing waits
    assert reason(7, 29) is None  # delivered within the ack wait
    assert reason(7, 3600, pulls=1) is None  # a bridge asks: the answer goes out at once
    assert unread_reason(None, idle_after_s=30) is None  # unknown is no evidence


def test_the_backlog_is_read_by_the_servers_clock_from_a_consumer_info_reply():
    info = {
        "ts": "2030-01-01T12:00:40.123456789Z",
        "created": "2030-01-01T11:00:00Z",
        "delivered": {"consumer_seq": 3, "stream_seq": 9, "last_active": "2030-01-01T12:00:10Z"},
        "num_pending": 5,
        "num_ack_pending": 2,
        "num_waiting": 0,
    }
    backlog = backlog_of(info)
    assert backlog is not None
    assert (backlog.waiting, backlog.pulls, round(backlog.idle_s, 3)) == (7, 0, 30.123)
    never = backlog_of({**info, "delivered": {"consumer_seq": 0, "stream_seq": 0}})
    assert never is not None and round(never.idle_s) == 3640  # since the consumer was created
    assert backlog_of({"error": {"code": 404}}) is None
    assert backlog_of({k: v for k, v in info.items() if k != "ts"}) is None


def test_status_line_of_unread_answers_points_at_the_bridge():
    gate = {"pipeline": "tabular", "closed_at": NOW.isoformat(), "reason": UNREAD_REASON}
    (line,) = gate_lines([gate])
    assert "answers unread: the NATS bridge is not consuming" in line
    assert "`mailroom bridge nats`" in line and "when a service answers" not in line


def test_reference_recognizer_may_run_beside_real_mail_only_under_mailroom_dev():
    real = Settings(intake={"mailboxes": [{**MAILBOX, "real": True}]})
    refusal = real_mailbox_refusal(real)
    assert refusal is not None and "'billing' is marked real" in refusal
    allowed = Settings(
        intake={"mailboxes": [{**MAILBOX, "real": True}]},
        recognizer={"allow_real_mailboxes": True},
    )
    assert real_mailbox_refusal(allowed) is None
    assert real_mailbox_refusal(Settings(intake={"mailboxes": [MAILBOX]})) is None


def test_recognizer_command_refuses_a_real_mailbox_in_one_line_and_exits_2():
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
    env = {
        **clean,
        "MAILROOM_INTAKE__MAILBOXES": json.dumps([{**MAILBOX, "real": True}]),
        # Nothing listens here: a recognizer that did not refuse would fail otherwise.
        "MAILROOM_NATS__URL": "nats://127.0.0.1:1",
        "MAILROOM_NATS__ALLOW_ANONYMOUS": "true",
    }
    result = subprocess.run(
        [sys.executable, "-m", "mailroom", "recognizer"],
        env=env,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mailroom: recognizer: refusing to start:")
    assert "'billing' is marked real" in lines[0]
