"""The ``email`` channel: SMTP through ``smtplib`` on a thread (STARTTLS, SSL or plain).

SMTP 4xx replies and connection errors are retryable, 5xx replies permanent.
Each chunk carries a stable ``Message-ID`` built from the message id and chunk
number, so a receiving system can spot a resend; SMTP itself has no
idempotency key, so the channel is not idempotent.
"""

from __future__ import annotations

import asyncio
import smtplib
import ssl
from email.message import EmailMessage
from email.utils import formatdate

from mailroom.adapters import oauth
from mailroom.adapters.channels import register
from mailroom.delivery.ports import Envelope
from mailroom.errors import AppError, ChannelRejected, ChannelUnavailable, UnknownAccount
from mailroom.outbound import check_header_value
from mailroom.settings import DeliverySettings, EmailAccount


@register("email")
class EmailChannel:
    """Sends each chunk as one mail over a fresh SMTP connection."""

    def __init__(self, account: str, settings: DeliverySettings) -> None:
        found = settings.email_accounts.get(account)
        if found is None:
            raise UnknownAccount(f"no email account {account[:50]!r}")
        self.account_name = account
        self.account: EmailAccount = found

    async def send(self, envelope: Envelope) -> str | None:
        """Send the chunk's mail; its ``Message-ID`` is the chunk's provider id."""
        mail = build_mail(envelope, self.account.sender)
        await asyncio.to_thread(self._send_blocking, mail)
        return str(mail["Message-ID"])

    async def aclose(self) -> None:
        return None

    def _send_blocking(self, mail: EmailMessage) -> None:
        account = self.account
        try:
            with _connect(account) as smtp:
                _login(smtp, account)
                smtp.send_message(mail)
        except smtplib.SMTPRecipientsRefused as exc:
            codes = [code for code, _ in exc.recipients.values()]
            detail = "; ".join(f"{code} {_text(msg)}" for code, msg in exc.recipients.values())
            raise _by_code(min(codes) if codes else 550, f"recipient refused: {detail}") from exc
        except smtplib.SMTPResponseException as exc:
            raise _by_code(exc.smtp_code, f"SMTP {exc.smtp_code} {_text(exc.smtp_error)}") from exc
        except smtplib.SMTPNotSupportedError as exc:
            raise ChannelRejected(f"SMTP server lacks a required extension: {exc}") from exc
        except (TimeoutError, smtplib.SMTPException, OSError) as exc:
            raise ChannelUnavailable(f"SMTP unavailable: {type(exc).__name__}: {exc}") from exc


def build_mail(envelope: Envelope, sender: str) -> EmailMessage:
    """The mail of one chunk; ``UnsafeHeaderValue`` when a header would carry CR, LF or a control.

    The subject comes from a route template over mail headers, so it is checked, never cleaned.
    """
    mail = EmailMessage()
    subject = envelope.subject or f"Notification {envelope.message_id}"
    if envelope.chunks > 1:
        subject = f"{subject} ({envelope.chunk}/{envelope.chunks})"
    mail["Subject"] = check_header_value("Subject", subject)
    mail["From"] = check_header_value("From", sender)
    mail["To"] = check_header_value("To", envelope.recipient)
    mail["Date"] = formatdate(usegmt=True)
    domain = sender.rpartition("@")[2] or "mailroom.invalid"
    mail["Message-ID"] = f"<mailroom.{envelope.message_id}.{envelope.chunk}@{domain}>"
    mail.set_content(envelope.body)
    return mail


def _connect(account: EmailAccount) -> smtplib.SMTP:
    if account.security == "ssl":
        return smtplib.SMTP_SSL(
            account.host,
            account.port,
            timeout=account.timeout_s,
            context=ssl.create_default_context(),
        )
    smtp = smtplib.SMTP(account.host, account.port, timeout=account.timeout_s)
    try:
        if account.security == "starttls":
            smtp.starttls(context=ssl.create_default_context())
    except BaseException:
        smtp.close()
        raise
    return smtp


def _login(smtp: smtplib.SMTP, account: EmailAccount) -> None:
    """AUTH with the password, or with an OAuth token (dropped from the cache if refused)."""
    if not account.username:
        return
    if account.auth == "password" or account.oauth is None:
        password = account.password.get_secret_value() if account.password else ""
        smtp.login(account.username, password)
        return
    token = oauth.TOKENS.token(account.oauth)
    first = oauth.sasl_string(account.auth.upper(), account.username, token)
    smtp.ehlo_or_helo_if_needed()
    try:
        # A refusal may come as a 334 error challenge first: an empty reply ends the exchange.
        smtp.auth(account.auth.upper(), lambda challenge=None: first if challenge is None else "")
    except smtplib.SMTPAuthenticationError:
        oauth.TOKENS.invalidate(account.oauth, token)
        raise


def _by_code(code: int, reason: str) -> AppError:
    if 400 <= code < 500:
        return ChannelUnavailable(reason)
    return ChannelRejected(reason)


def _text(value: bytes | str) -> str:
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return repr(text[:200])
