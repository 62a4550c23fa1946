"""Settings of notifications and delivery: channel accounts, routes, limits."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SecretStr, model_validator

from mailroom import outbound, webhooks
from mailroom.errors import UnsafeHeaderValue, WebhookTargetRefused
from mailroom.settings.base import (
    ROUTE_PLACEHOLDERS,
    SMTP_PORTS,
    StrictModel,
    _default_port,
)
from mailroom.settings.checks import unknown_placeholders
from mailroom.settings.oauth import AuthKind, OAuthSettings, check_login


class WebhookAccount(StrictModel):
    url: str
    #: Longest wait to connect, and for each read of the answer, in seconds (a wait for one
    #: of the ``max_in_flight`` connections is not counted).
    timeout_s: float = 10.0
    #: Requests (and connections) in flight to this account from one worker process; the
    #: others wait their turn. The default suits a receiver answering within ~200 ms (about
    #: 160 requests/s per process); lower it for a receiver that takes fewer connections,
    #: raise it for a slower one. At 16 a worker sending to a fast receiver spent about a
    #: tenth more CPU per webhook: its event loop woke for fewer answers at a time.
    max_in_flight: int = Field(32, gt=0, le=1_000)
    #: Active signing secrets (``whsec_<base64 key>``, or a raw string of 16+ bytes); each signs
    #: every request (``webhook-signature``), so a new one can be added before the old one goes.
    #: A single ``secret`` key is still read as a list of one.
    secrets: list[SecretStr] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _single_secret(cls, data: Any) -> Any:
        """The older single ``secret`` key joins ``secrets``."""
        if isinstance(data, dict) and "secret" in data:
            data = dict(data)
            single = data.pop("secret")
            data["secrets"] = [*data.get("secrets", []), *([single] if single else [])]
        return data

    @model_validator(mode="after")
    def _check_secrets(self) -> WebhookAccount:
        for index, secret in enumerate(self.secrets):
            try:
                webhooks.secret_key(secret.get_secret_value())
            except ValueError as exc:
                raise ValueError(f"secrets.{index}: {exc}") from None
        return self


class EmailAccount(StrictModel):
    host: str
    # NOTE: the 0 never stays (_port_for_security fills or refuses it); it lets callers omit it.
    #: Default: 587 for ``starttls``, 465 for ``ssl``; ``plain`` needs it given.
    port: int = 0
    #: ``plain`` sends mail (and any password) in clear: only for loopback sinks.
    security: Literal["ssl", "starttls", "plain"] = "starttls"
    username: str | None = None
    password: SecretStr | None = None
    #: ``password`` (AUTH with username and password when username is set), or ``xoauth2`` /
    #: ``oauthbearer`` with a token from ``oauth`` for ``username``.
    auth: AuthKind = "password"
    #: The token endpoint and grant of a token login (keys: token_url, client_id, client_secret,
    #: grant, refresh_token, scope, refresh_margin_s, timeout_s; see the operating guide on logins).
    oauth: OAuthSettings | None = None
    sender: str = "mailroom@localhost"
    timeout_s: float = 10.0

    @model_validator(mode="before")
    @classmethod
    def _port_for_security(cls, data: Any) -> Any:
        return _default_port(data, SMTP_PORTS, "starttls")

    @model_validator(mode="after")
    def _check_sender(self) -> EmailAccount:
        """A sender with CR, LF or a control would inject headers: refused at load."""
        try:
            outbound.check_header_value("From", self.sender)
        except UnsafeHeaderValue as exc:
            raise ValueError(f"sender: {exc}") from None
        return self

    @model_validator(mode="after")
    def _check_login(self) -> EmailAccount:
        if self.auth != "password" and not self.username:
            raise ValueError(f"auth {self.auth!r} needs username (the mailbox the token is for)")
        check_login("email account", self.auth, self.password or SecretStr(""), self.oauth)
        return self


class RateLimit(StrictModel):
    #: Sends allowed per second, on average, for one (channel, account).
    per_second: float
    burst: int = 1


class NotificationRoute(StrictModel):
    mailbox: str = "*"
    document_type: str = "*"
    channel: str = "log"
    account: str = "default"
    recipient: str = "ops"
    #: ``str.format`` templates (checked at load) over {mail_id}, {mailbox}, {uid},
    #: {mail_subject}, {sender} (``Display Name <address>``), {sender_address} (the address
    #: of From alone), {sender_name} (the name the mail claims), {document_types} and {summary}.
    subject: str = "Mail {mail_subject!s} processed"
    template: str = "{summary}"

    @model_validator(mode="after")
    def _check_templates(self) -> NotificationRoute:
        """Unknown placeholders fail at load, not when the first mail is notified."""
        route = f"route {self.channel}:{self.account} -> {self.recipient}"
        for name in ("subject", "template"):
            text = getattr(self, name)
            try:
                unknown = unknown_placeholders(text, ROUTE_PLACEHOLDERS)
                if not unknown:
                    text.format_map(ROUTE_PLACEHOLDERS)
            except (ValueError, KeyError, AttributeError, IndexError, TypeError) as exc:
                raise ValueError(f"{route}: {name} {text!r} cannot be formatted: {exc}") from None
            if unknown:
                raise ValueError(
                    f"{route}: unknown placeholder {{{unknown[0]}}} in {name}; "
                    f"known: {', '.join(ROUTE_PLACEHOLDERS)}"
                )
        return self


class DeliverySettings(StrictModel):
    #: Redis of the delivery stream, locks and rate limits; empty means ``redis.url``.
    redis_url: str = ""
    #: With ``redis.sentinels``: the name the sentinels monitor this link's master under, when
    #: the stream has a Redis of its own; empty means ``redis.sentinel_master``.
    sentinel_master: str = ""
    #: Not under the broker namespace: Dramatiq keeps its "delivery" queue at "{namespace}:delivery".
    stream_key: str = "mailroom:delivery-stream"
    consumer_group: str = "mailroom-delivery"
    #: Stream entries idle for longer than this are claimed from dead bridges, in milliseconds.
    claim_idle_ms: int = 30_000
    #: Stream entries read at once; the bridge sends them as one ``deliver_channel_messages``
    #: batch. 200 rather than 100: a batch's own work (the accounts' version query, its lanes
    #: and lease, its log line) and its tail (lanes ending one by one) are spread over twice the
    #: messages; a 1 x 8 worker delivered about 7 % more webhooks a second (``bench/delivery.py``).
    read_count: int = 200
    read_block_ms: int = 1_000
    #: Approximate upper bound on stream length (XADD MAXLEN ~).
    stream_maxlen: int = 100_000
    lock_ttl_ms: int = 30_000
    #: Messages of one batch (``deliver_channel_messages``) sent at the same time. Each is
    #: claimed (attempt counted, ``sending``) before it waits for one of its account's
    #: ``max_in_flight`` connections: 8 threads x 25 lanes keep a worker process's 32 requests
    #: in flight with half the claimed messages waiting that 50 lanes had, and less CPU a send.
    batch_concurrency: int = 25
    max_attempts: int = 8
    backoff_base_s: float = 2.0
    backoff_cap_s: float = 600.0
    chunk_size: int = 4_000
    delivered_ttl_s: int = 7 * 24 * 3600
    #: Messages stuck in ``sending`` longer than this are recovered, in seconds.
    stale_after_s: float = 300.0
    #: Pending messages added this long ago and not picked up are re-added, in seconds.
    readd_after_s: float = 600.0
    #: Most messages one re-add or stale-recovery pass handles.
    sweep_batch_size: int = 1_000
    #: Final mails one notification pass handles (the actor re-sends itself for more), in mails.
    notification_batch_size: int = 100
    #: How often the bridge looks for entries of dead bridges (XAUTOCLAIM), in milliseconds.
    claim_interval_ms: int = 5_000
    #: A consumer of the group with nothing pending and idle this long is deleted (each
    #: bridge process is a consumer named host-pid, so restarts leave old ones), in seconds.
    consumer_forget_after_s: float = 3_600.0
    #: Longest wait between the bridge's reconnect attempts, in seconds.
    reconnect_max_backoff_s: float = 10.0
    webhook_accounts: dict[str, WebhookAccount] = Field(default_factory=dict)
    #: Hosts webhooks may be sent to: names (hooks.example.com), *.example.com, * for any name,
    #: IP addresses and networks (10.0.0.0/8). Loopback, private, link-local and other
    #: non-public addresses are refused, at load and in every send's DNS answer, unless listed.
    webhook_allowed_hosts: list[str] = Field(default_factory=list)
    #: Let webhooks go over plain http:// (mailroom dev, tests); off: https only.
    webhook_allow_http: bool = False
    email_accounts: dict[str, EmailAccount] = Field(default_factory=dict)
    rate_limits: dict[str, RateLimit] = Field(default_factory=dict)
    routes: list[NotificationRoute] = Field(default_factory=lambda: [NotificationRoute()])

    @property
    def webhook_allow_list(self) -> outbound.AllowList:
        return outbound.AllowList.parse(
            self.webhook_allowed_hosts, allow_http=self.webhook_allow_http
        )

    @model_validator(mode="after")
    def _check_webhook_targets(self) -> DeliverySettings:
        """Each webhook URL is on the allow-list (its DNS answers are checked at each send)."""
        try:
            allow = self.webhook_allow_list
        except ValueError as exc:
            raise ValueError(f"webhook_allowed_hosts: {exc}") from None
        for name, account in self.webhook_accounts.items():
            try:
                outbound.check_url(account.url, allow)
            except WebhookTargetRefused as exc:
                raise ValueError(f"webhook_accounts.{name}: {exc}") from None
        return self
