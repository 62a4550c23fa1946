"""A result whose inbox apply or mapping kills the worker (``os._exit``) ends its job, not the flow.

Both count their attempts on the job in Postgres before the work, so deaths
that record nothing still add up: past ``max_processing_attempts`` the job
fails with a reason (``INBOX_ATTEMPTS_EXHAUSTED`` / ``MAPPING_ATTEMPTS_EXHAUSTED``),
its file goes ERROR, its mail becomes final and is notified, and the other
mails are recognized meanwhile.
"""

from __future__ import annotations

import pytest

from mailroom.devtools.seed import build_mail, invoice_csv, invoice_mails
from tests.faults.dying_worker import DyingWorkers
from tests.faults.probe_actors import DIE_IN_INBOX, DIE_IN_MAPPING

pytestmark = pytest.mark.faults

# Three, not two: an innocent job in flight beside a poison's first, not yet suspect, attempt
# is charged for its death; each poison (one in the inbox, one in mapping) brings one such
# death, so with two an innocent job could run out beside them (ARCHITECTURE, attempts).
MAX_ATTEMPTS = 3
GOOD = 3


def _poison(name: str, n: int) -> bytes:
    return build_mail(
        f"Invoice {n}", [(f"{name}.csv", "text/csv", invoice_csv(n))], sender="p@example.test"
    )


def test_a_result_that_kills_the_inbox_or_mapping_fails_its_job_and_the_rest_flows(make_system):
    system = make_system(MAILROOM_RECOGNITION__MAX_PROCESSING_ATTEMPTS=str(MAX_ATTEMPTS))
    for name in ("bridge-nats", "bridge-stream", "recognizer", "scheduler"):
        system.start(name)
    workers = DyingWorkers(system).start()
    system.append(_poison(DIE_IN_INBOX, 90), *invoice_mails(1, GOOD), _poison(DIE_IN_MAPPING, 91))

    def notified() -> bool:
        workers.check()
        return system.scalar("SELECT count(*) FROM channel_message") >= 2 * (GOOD + 2)

    system.wait_for("every mail final and notified", notified, timeout_s=120)

    files = system.query(
        "SELECT f.original_name, f.status, COALESCE(split_part(f.status_reason, ':', 1), ''), "
        "j.status, "
        "j.error_code, m.status FROM stored_file AS f "
        "JOIN recognition_job AS j ON j.id = f.current_recognition_job_id "
        "JOIN inbound_mail AS m ON m.id = f.mail_id ORDER BY f.id"
    )
    by_name = {name: rest for name, *rest in files}
    assert by_name.pop(f"{DIE_IN_INBOX}.csv") == [
        "ERROR",
        "INBOX_ATTEMPTS_EXHAUSTED",
        "error",
        "INBOX_ATTEMPTS_EXHAUSTED",
        "final",
    ]
    # Mapping's verdict settles the file; the job keeps the service's answer and the reason.
    assert by_name.pop(f"{DIE_IN_MAPPING}.csv") == [
        "ERROR",
        "MAPPING_ATTEMPTS_EXHAUSTED",
        "done",
        "MAPPING_ATTEMPTS_EXHAUSTED",
        "final",
    ]
    assert list(by_name.values()) == [["RECOGNIZED", "", "done", None, "final"]] * GOOD
    # What stays counted is the deaths, each on its own job's key: the maximum, or one more when
    # the other poison's first, not yet suspect, attempt died in the same process while the
    # exhausted attempt (counted past the maximum, given back once written) was in flight.
    counts = dict(
        system.query(
            "SELECT f.original_name, j.metrics - 'republish_count' FROM recognition_job AS j "
            "JOIN stored_file AS f ON f.id = j.file_id WHERE starts_with(f.original_name, 'die-in-')"
        )
    )
    charged = (MAX_ATTEMPTS, MAX_ATTEMPTS + 1)
    assert counts[f"{DIE_IN_INBOX}.csv"].get("inbox_attempts") in charged
    assert counts[f"{DIE_IN_MAPPING}.csv"].get("mapping_attempts") in charged
    bodies = system.query(
        "SELECT body FROM channel_message AS c JOIN stored_file AS f ON f.mail_id = c.mail_id "
        "WHERE starts_with(f.original_name, 'die-in-')"
    )
    assert len(bodies) == 4 and all("ERROR" in body for (body,) in bodies)
    assert workers.deaths >= 2 * MAX_ATTEMPTS
    print(f"{workers.deaths} worker deaths")
