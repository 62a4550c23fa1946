"""``describe`` turns failures of the outside world into a line or two, and leaves bugs alone."""

from __future__ import annotations

import psycopg
import pytest
import redis.exceptions
import sqlalchemy.exc

from mailroom.cli.errors import EXIT_UNAVAILABLE, describe
from mailroom.errors import (
    MailboxLoginRejected,
    NatsUnavailable,
    OAuthTokenRefused,
    OAuthTokenUnavailable,
)


def _lines(exc: BaseException) -> list[str]:
    failure = describe(exc)
    assert failure is not None
    assert failure.exit_code == EXIT_UNAVAILABLE
    assert len(failure.lines) <= 2
    return failure.lines


def _raised_from(outer: Exception, cause: Exception) -> Exception:
    try:
        try:
            raise cause
        except Exception as exc:
            raise outer from exc
    except Exception as caught:
        return caught


def test_unreachable_redis_names_host_port_and_variable(monkeypatch):
    monkeypatch.setenv("MAILROOM_REDIS__URL", "redis://:hunter2@10.0.0.9:6380/0")
    first, hint = _lines(redis.exceptions.ConnectionError("Error 111 connecting to 10.0.0.9:6380."))
    assert first == "mailroom: cannot reach Redis: Error 111 connecting to 10.0.0.9:6380."
    assert "MAILROOM_REDIS__URL (now redis://:***@10.0.0.9:6380/0)" in hint


def test_refused_redis_login_says_check_the_password():
    (first, hint) = _lines(redis.exceptions.AuthenticationError("invalid password"))
    assert "Redis refused the login" in first
    assert "password" in hint


def test_unreachable_nats_through_the_adapter_error():
    first, hint = _lines(NatsUnavailable("connect nats://127.0.0.1:4222: NoServersError"))
    assert first.startswith("mailroom: cannot reach NATS")
    assert "MAILROOM_NATS__URL" in hint


def test_refused_imap_login_names_the_mailboxes_variable():
    first, hint = _lines(MailboxLoginRejected("LOGIN failed for billing@imap.corp:993"))
    assert "IMAP server refused the login" in first
    assert "MAILROOM_INTAKE__MAILBOXES" in hint


def test_an_untrusted_redis_certificate_points_at_the_ca_not_at_a_dead_server():
    first, hint = _lines(
        redis.exceptions.ConnectionError(
            "Error 1 connecting to 127.0.0.1:6380. [SSL: CERTIFICATE_VERIFY_FAILED] "
            "certificate verify failed: unable to get local issuer certificate."
        )
    )
    assert first.startswith("mailroom: Redis's TLS certificate was not trusted: Error 1")
    assert "MAILROOM_REDIS__TLS__CA_FILE" in hint and "running" not in hint


def test_a_refused_oauth_grant_says_which_secrets_to_check():
    first, hint = _lines(OAuthTokenRefused("token endpoint: invalid_grant (refresh token revoked)"))
    assert first == (
        "mailroom: the OAuth token endpoint refused the grant: "
        "token endpoint: invalid_grant (refresh token revoked)"
    )
    assert "refresh_token" in hint and "MAILROOM_INTAKE__MAILBOXES" in hint


def test_an_unreachable_token_endpoint_is_one_line():
    first, _ = _lines(OAuthTokenUnavailable("POST https://login.example/token: timed out"))
    assert (
        first == "mailroom: cannot get an OAuth token: POST https://login.example/token: timed out"
    )


def test_database_error_wrapped_by_sqlalchemy_is_found_through_its_cause():
    orig = psycopg.OperationalError(
        'connection failed: connection to server at "db", port 5432 failed: timeout expired\n'
        "\tIs the server running on that host?"
    )
    wrapped = _raised_from(sqlalchemy.exc.OperationalError("SELECT 1", {}, orig), orig)
    first, _ = _lines(wrapped)
    assert first == (
        'mailroom: cannot reach Postgres: connection to server at "db", port 5432 failed: '
        "timeout expired"
    )


def test_refused_database_login_and_missing_schema_get_their_own_advice():
    login = psycopg.OperationalError('FATAL:  password authentication failed for user "app"')
    assert "Postgres refused the login" in _lines(login)[0]
    schema = psycopg.errors.UndefinedTable('relation "inbound_mail" does not exist')
    assert "mailroom migrate" in _lines(schema)[1]


def test_a_lock_wait_or_statement_timeout_is_not_called_unreachable():
    [lock, _] = _lines(psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"))
    assert lock.startswith("mailroom: a table is locked by another Postgres session")
    [timeout, _] = _lines(psycopg.errors.QueryCanceled("canceling statement due to timeout"))
    assert timeout.startswith("mailroom: a Postgres statement timed out")


def test_a_failure_inside_an_exception_group_is_found():
    group = ExceptionGroup("tasks", [ConnectionRefusedError(111, "Connection refused")])
    assert "cannot connect" in _lines(group)[0]


@pytest.mark.parametrize(
    "bug", [KeyError("x"), ValueError("bad"), FileNotFoundError("f"), RuntimeError("r")]
)
def test_bugs_keep_their_traceback(bug):
    assert describe(bug) is None
