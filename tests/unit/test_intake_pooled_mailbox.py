"""A kept connection is checked by the poll's SELECT, not by a NOOP of its own."""

from __future__ import annotations

from mailroom.errors import MailboxUnavailable
from mailroom.intake.connections import ConnectionPool
from mailroom.settings import MailboxSettings


class RecordingMailbox:
    """Records the commands sent on it; ``dropped`` makes the next SELECT find it gone."""

    def __init__(self, settings: MailboxSettings, log: list[tuple[int, str]]) -> None:
        self.settings = settings
        self.log = log
        self.number = sum(1 for _, command in log if command == "LOGIN")
        self.dropped = False

    async def connect(self) -> None:
        self.log.append((self.number, "LOGIN"))

    async def check_health(self) -> None:
        self.log.append((self.number, "NOOP"))

    async def select(self, folder: str) -> int:
        self.log.append((self.number, f"SELECT {folder}"))
        if self.dropped:
            raise MailboxUnavailable("SELECT: connection reset")
        return 7

    async def close(self) -> None:
        self.log.append((self.number, "CLOSE"))


def settings() -> MailboxSettings:
    return MailboxSettings(name="box", host="imap.test", username="u", password="p")


async def test_a_kept_connection_serves_the_next_poll_without_a_noop() -> None:
    log: list[tuple[int, str]] = []
    pool = ConnectionPool(lambda s: RecordingMailbox(s, log))  # type: ignore[arg-type,return-value]
    for folder in ("a", "b"):
        mailbox = pool(settings())
        await mailbox.connect()
        await mailbox.check_health()
        assert await mailbox.select(folder) == 7
        await mailbox.close()

    assert log == [(0, "LOGIN"), (0, "NOOP"), (0, "SELECT a"), (0, "SELECT b")]
    await pool.aclose()


async def test_a_kept_connection_the_server_dropped_is_replaced_at_its_select() -> None:
    log: list[tuple[int, str]] = []
    opened: list[RecordingMailbox] = []

    def connect(s: MailboxSettings) -> RecordingMailbox:
        opened.append(RecordingMailbox(s, log))
        return opened[-1]

    pool = ConnectionPool(connect)  # type: ignore[arg-type]
    first = pool(settings())
    await first.connect()
    await first.select("a")
    await first.close()
    opened[0].dropped = True

    second = pool(settings())
    await second.connect()
    await second.check_health()
    assert await second.select("b") == 7
    await second.close()

    assert log[2:] == [(0, "SELECT b"), (0, "CLOSE"), (1, "LOGIN"), (1, "SELECT b")]
    assert pool.take(next(iter(pool._kept))) is opened[1]
    await pool.aclose()


async def test_kept_logins_have_a_total_cap_and_the_least_recent_go_first() -> None:
    log: list[tuple[int, str]] = []
    pool = ConnectionPool(lambda s: RecordingMailbox(s, log), max_kept=2)  # type: ignore[arg-type,return-value]
    users = ["u0", "u1", "u2"]
    for user in users:  # three accounts, one poll each, in turn
        mailbox = pool(settings().model_copy(update={"username": user}))
        await mailbox.connect()
        await mailbox.select("INBOX")
        await mailbox.close()

    # The first account's login was given back longest ago: it is the one logged out.
    assert [entry for entry in log if entry[1] == "CLOSE"] == [(0, "CLOSE")]
    assert sum(len(kept) for kept in pool._kept.values()) == 2
    await pool.aclose()


class RedisDown:
    """Account slots whose Redis does not answer."""

    limit = 8
    ttl_ms = 15_000

    async def take(self, account: str, holder: str, *, limit: int | None = None) -> bool:
        from redis.exceptions import ConnectionError as RedisConnectionError

        raise RedisConnectionError("Connection refused")

    async def give_back(self, account: str, holder: str) -> None:
        raise AssertionError("nothing was taken")


async def test_without_redis_a_poll_logs_in_uncounted() -> None:
    log: list[tuple[int, str]] = []
    pool = ConnectionPool(lambda s: RecordingMailbox(s, log), slots=RedisDown())  # type: ignore[arg-type,return-value]
    mailbox = pool(settings())
    await mailbox.connect()
    assert await mailbox.select("INBOX") == 7
    await mailbox.close()

    assert log[:2] == [(0, "LOGIN"), (0, "SELECT INBOX")]
    await pool.aclose()
