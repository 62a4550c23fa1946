"""Intake throughput next to a durable raw loop doing the same work, measured in one run.

Starts an embedded Postgres (``mailroom.devtools.stack``) and a pymap server (its
in-memory dict backend, as a child process), APPENDs small mails with one CSV
attachment each into a fresh folder, then measures, in rounds:

- raw: ``raw_intake``'s plain loop doing intake's work durably (imapclient fetch in
  intake's chunks, stdlib parse, the ``.eml`` and attachments written and synced, a
  transaction of rows per chunk) without its protocol (no lease, dedupe, fence, per-mail
  transaction or overlap) — mails per second, before the first round and after each;
- intake: the intake pipeline as the actor runs it, with the settings ``mailroom dev`` uses:
  polls of ``batch_size`` mails one after another while more is waiting (claim, batch
  under the lease, parse, object store, fenced commits in groups), over connections kept
  between polls, on a new cursor and an empty object store each round — mails per second,
  set against the mean of the raw runs on either side.

The result is the median ratio of the rounds. Like with like: both sides store every mail
with the same durability, so the ratio is what intake's guarantees cost. Beside it, for
context only, a bare imapclient fetch of the same mails (stores nothing) shows how fast
the server hands them out. Then, in a fresh child process (so its
figure is its own), a warm intake reads one 41 MB mail with a 30 MB attachment (over
``max_attachment_bytes``) and reports how far the mail raised its peak RSS; and again, in
another child, eight such mails that arrived together, read by one poll.

Durable by default: Postgres with fsync and synchronous commit on, the object store on
disk (``--fast``: fsync off, state in /dev/shm; the first line says which).

A round's system CPU per mail is mostly the object store's new files. On ext4 without a
journal, creating a file within about 30 s of many deletions (another run's cleanup of
its state) scans past each inode freed then (``recently_deleted``): a round that
follows such a cleanup shows twice the system CPU or more, and its wall time with it.

Usage: ``uv run python bench/intake.py [--mails N] [--rounds N] [--quick] [--fast]``. The last lines
are ``RESULT intake ratio=<intake/durable raw> target=0.5``,
``RESULT intake_big_mail_rss_mib value=<MiB> target=64`` and
``RESULT intake_big_mails_parallel_rss_mib value=<MiB> target=256``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import statistics
import subprocess
import sys
import time
from email.message import EmailMessage
from pathlib import Path

import durability  # bench/, on the path when run as a script
from imapclient import IMAPClient
from raw_intake import raw_durable_intake  # bench/, as durability
from stages import ProcessCpu  # bench/, as durability

from mailroom.adapters.imap import ImapMailbox
from mailroom.adapters.storage import build_store
from mailroom.db.engine import create_engine, create_sessionmaker
from mailroom.db.migrate import upgrade
from mailroom.devtools.children import remove_folder, spawn
from mailroom.devtools.stack import EmbeddedPostgres, _wait_for_port, find_binary, free_port
from mailroom.intake.connections import ConnectionPool
from mailroom.intake.poll import IntakeDeps, poll_mailbox
from mailroom.settings import (
    DatabaseSettings,
    IntakeSettings,
    MailboxSettings,
    Settings,
    StorageSettings,
)

USER, PASSWORD, FOLDER = "demouser", "demopass", "Bench"
TARGET = 0.5
#: Folder of the big-mail run, and the most its mail may raise the peak RSS, in MiB.
BIG_FOLDER, BIG_TARGET_MIB = "BenchBig", 64
#: Big mails that arrive together in the second big-mail run (one poll reads them all), its
#: folder, and the most they may raise the peak RSS, in MiB.
PARALLEL_BIG_MAILS, PARALLEL_FOLDER, PARALLEL_TARGET_MIB = 8, "BenchBig8", 256
#: Size of the big mail's attachment, in bytes (base64 makes the mail about 41 MB).
BIG_ATTACHMENT_BYTES = 30_000_000
#: Mails per APPEND of the setup.
CHUNK = 100
#: Mails per FETCH of the baseline: what intake asks for in one command.
FETCH_CHUNK = IntakeSettings().fetch_chunk
#: Memory-backed folder for the run's state, where the host has one.


def make_mail(n: int) -> bytes:
    csv = f"invoice_number,total\nA-{n},{n}.50\n".encode()
    # A boundary of its own, as mail programs write one: a fixed one let the stdlib parser
    # reuse the regular expression it compiles per boundary, which real mail never does.
    boundary = b"=_bench-%d.%016x" % (n, random.getrandbits(64))
    return (
        b"From: Bench <bench@example.com>\r\nTo: intake@example.com\r\n"
        b"Subject: bench %d\r\nMessage-ID: <bench-%d@example.com>\r\nMIME-Version: 1.0\r\n"
        b'Content-Type: multipart/mixed; boundary="%b"\r\n\r\n'
        b"--%b\r\nContent-Type: text/plain\r\n\r\nmail %d\r\n"
        b'--%b\r\nContent-Type: text/csv\r\nContent-Disposition: attachment; filename="inv-%d.csv"'
        b"\r\n\r\n%b\r\n--%b--\r\n"
    ) % (n, n, boundary, boundary, n, boundary, n, csv, boundary)


def start_pymap(port: int, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        process = spawn(
            [
                str(find_binary("pymap")),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--no-tls",
                "dict",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    _wait_for_port("pymap", port, process, log)
    return process


def fill_folder(port: int, count: int) -> None:
    client = IMAPClient("127.0.0.1", port=port, ssl=False, timeout=60)
    try:
        client.login(USER, PASSWORD)
        client.create_folder(FOLDER)
        for start in range(0, count, CHUNK):
            client.multiappend(
                FOLDER, [make_mail(n) for n in range(start, min(count, start + CHUNK))]
            )
    finally:
        client.logout()


def raw_fetch(port: int) -> tuple[int, float]:
    started = time.perf_counter()
    client = IMAPClient("127.0.0.1", port=port, ssl=False, timeout=60)
    try:
        client.login(USER, PASSWORD)
        client.select_folder(FOLDER)
        uids = sorted(client.search(["UID", "1:*"]))
        fetched = 0
        for start in range(0, len(uids), FETCH_CHUNK):
            # The items intake fetches: RFC822 would also set \Seen, which intake never does.
            data = client.fetch(uids[start : start + FETCH_CHUNK], ["BODY.PEEK[]", "INTERNALDATE"])
            fetched += sum(1 for item in data.values() if item.get(b"BODY[]"))
    finally:
        client.logout()
    return fetched, time.perf_counter() - started


async def run_intake(settings: Settings, name: str) -> tuple[int, float, int]:
    """Polls of the mailbox until none says more is waiting: mails, seconds and polls."""
    engine = create_engine(settings.database)
    connections = ConnectionPool(ImapMailbox)  # as the intake actor keeps its logins
    ingested = polls = 0
    try:
        deps = IntakeDeps(
            sessions=create_sessionmaker(engine),
            store=build_store(settings),
            connect=connections,
            nudge=_no_nudge,
        )
        started = time.perf_counter()
        while True:
            outcome = await poll_mailbox(name, settings=settings.intake, deps=deps)
            polls += 1
            if outcome.status != "done" or outcome.result is None:
                raise SystemExit(f"intake did not finish: {outcome}")
            ingested += outcome.result.ingested
            if not outcome.more_waiting:
                break
        elapsed = time.perf_counter() - started
    finally:
        await connections.aclose()
        await engine.dispose()
    return ingested, elapsed, polls


async def _no_nudge() -> None:
    return None


def log_like_the_worker(path: Path) -> None:
    """Log as ``mailroom dev``'s intake worker does (``configure_logging``: INFO, one line per
    mail stored, its format and filters), into a file; the console keeps only warnings."""
    from mailroom.process.observability import configure_logging

    root = logging.getLogger()
    for handler in list(root.handlers):  # the bench's own console handler: the worker's instead
        root.removeHandler(handler)
    configure_logging(Settings(), process="worker-intake")
    to_file = logging.FileHandler(path)
    for handler in root.handlers:
        to_file.setFormatter(handler.formatter)
        for log_filter in handler.filters:
            to_file.addFilter(log_filter)
        handler.setLevel(logging.WARNING)
    root.addHandler(to_file)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mails", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3, help="intake runs, each between raw ones")
    # The full run (2,000 mails, three rounds) takes about 30 s, so --quick is the same run.
    parser.add_argument("--quick", action="store_true", help="done within 60 s (2,000 mails)")
    # The big-mail run's child process: it reads BIG_FOLDER and prints its RSS figure.
    parser.add_argument(
        "--big-mail-child",
        nargs=5,
        metavar=("DB_URL", "PORT", "STATE_DIR", "FOLDER", "MAILS"),
        help=argparse.SUPPRESS,
    )
    durability.add_flags(parser)
    args = parser.parse_args()
    count = args.mails
    logging.basicConfig(level=logging.WARNING)
    if args.big_mail_child:
        database_url, port, state_dir, folder, mails = args.big_mail_child
        return big_mail_child(database_url, int(port), Path(state_dir), folder, int(mails))

    # Durable by default, as production runs; the object store's two new files per mail cost
    # kernel time on ext4 that varies with the disk's history, so each round prints CPU per mail.
    workdir = durability.state_dir(args, "bench-intake-")
    log_like_the_worker(workdir / "intake.log")
    postgres = EmbeddedPostgres(workdir / "postgres", fast=args.fast, database="bench")
    pymap: subprocess.Popen[bytes] | None = None
    try:
        postgres.start()
        upgrade(postgres.url())
        port = free_port()
        pymap = start_pymap(port, workdir / "pymap.log")
        started = time.perf_counter()
        fill_folder(port, count)
        print(f"setup: {count} mails appended in {time.perf_counter() - started:.1f} s")

        # raw, intake, raw, intake, …, raw: each intake round is set against the durable raw
        # runs on either side of it, so load that comes and goes on the host hits both, and
        # the median of the rounds is the result. Each run stores into a fresh state of its own.
        fetch_rates = [_fetch_round(port)]
        raw_rates = [_durable_raw_round(postgres.url(), port, workdir / "raw-0")]
        ratios, intake_rates = [], []
        for n in range(args.rounds):
            others = _OtherCpu(postgres.pgdata / "postmaster.pid", pymap.pid)
            intake_rate = _intake_round(postgres.url(), port, workdir / f"round-{n}", n, count)
            print(others.per_mail(count))
            intake_rates.append(intake_rate)
            raw_rates.append(_durable_raw_round(postgres.url(), port, workdir / f"raw-{n + 1}"))
            ratios.append(intake_rate / statistics.fmean(raw_rates[-2:]))
        fetch_rates.append(_fetch_round(port))
        print("ratios per round: " + ", ".join(f"{r:.2f}" for r in ratios))
        fetched = statistics.fmean(fetch_rates)
        print(
            f"for context: intake ran at {statistics.median(intake_rates) / fetched:.2f} and the"
            f" durable raw loop at {statistics.fmean(raw_rates) / fetched:.2f} of the bare fetch"
        )
        rise_mib = _big_mail_round(postgres.url(), port, workdir / "big", BIG_FOLDER, 1)
        parallel_mib = _big_mail_round(
            postgres.url(), port, workdir / "big8", PARALLEL_FOLDER, PARALLEL_BIG_MAILS
        )
        print(f"RESULT intake ratio={statistics.median(ratios):.2f} target={TARGET}")
        print(f"RESULT intake_big_mail_rss_mib value={rise_mib:.0f} target={BIG_TARGET_MIB}")
        print(
            f"RESULT intake_big_mails_parallel_rss_mib value={parallel_mib:.0f} "
            f"target={PARALLEL_TARGET_MIB}"
        )
        return 0
    finally:
        if pymap is not None:
            pymap.terminate()
            pymap.wait(10)
        postgres.stop()
        remove_folder(workdir)


def _durable_raw_round(database_url: str, port: int, root: Path) -> float:
    """The same mails through ``raw_intake``'s plain durable loop: mails per second."""
    stored, seconds = raw_durable_intake(
        port, USER, PASSWORD, FOLDER, FETCH_CHUNK, database_url, root
    )
    print(
        "durable raw loop (bench/raw_intake.py: fetch, parse, objects synced, rows committed): "
        f"{stored} mails in {seconds:.2f} s = {stored / seconds:.0f} mails/s"
    )
    return stored / seconds


def _fetch_round(port: int) -> float:
    fetched, seconds = raw_fetch(port)
    print(
        f"bare imapclient fetch (stores nothing): {fetched} mails in {seconds:.2f} s"
        f" = {fetched / seconds:.0f} mails/s"
    )
    return fetched / seconds


def _settings(
    database_url: str,
    port: int,
    state_dir: Path,
    name: str,
    folder: str,
    batch_size: int = MailboxSettings.model_fields["batch_size"].default,
) -> Settings:
    mailbox = MailboxSettings(
        name=name,
        host="127.0.0.1",
        port=port,
        security="plain",
        username=USER,
        password=PASSWORD,
        folder=folder,
        batch_size=batch_size,
        idle=False,
        timeout_s=60,
    )
    return Settings(
        state_dir=state_dir,
        database=DatabaseSettings(url=database_url, pool_size=4),
        storage=StorageSettings(kind="filesystem"),
        intake=IntakeSettings(mailboxes=[mailbox]),
    )


def _intake_round(database_url: str, port: int, state_dir: Path, n: int, count: int) -> float:
    """One intake of the whole folder: a new mailbox cursor and a new, empty object store."""
    name = f"bench-{n}"
    settings = _settings(database_url, port, state_dir, name, FOLDER)
    cpu_before = os.times()
    ingested, seconds, polls = asyncio.run(run_intake(settings, name))
    cpu = os.times()
    rate = ingested / seconds
    user_ms = (cpu.user - cpu_before.user) / ingested * 1000
    system_ms = (cpu.system - cpu_before.system) / ingested * 1000
    print(
        f"intake pipeline, round {n + 1}: {ingested} mails in {polls} polls, {seconds:.2f} s "
        f"= {rate:.0f} mails/s"
        f" (this process: {user_ms:.2f} ms user + {system_ms:.2f} ms system CPU per mail)"
    )
    if ingested != count:
        print(f"warning: intake stored {ingested} of {count} mails")
    return rate


class _OtherCpu:
    """CPU time Postgres (its server processes, and backends that ended) and pymap spend.

    Intake's wall time is bound by the CPU of three processes on a small machine: the
    round's own line says this process's share, this one the others'.
    """

    def __init__(self, postmaster_pid_file: Path, pymap_pid: int) -> None:
        postmaster = int(postmaster_pid_file.read_text().split()[0])
        self._cpu = ProcessCpu({"postgres": postmaster, "pymap": pymap_pid})

    def per_mail(self, mails: int) -> str:
        used = self._cpu.since_start()
        postgres, pymap = used["postgres"], used["pymap"]
        return (
            f"  Postgres {postgres / mails * 1000:.2f} ms and pymap {pymap / mails * 1000:.2f} ms"
            " CPU per mail (user + system)"
        )


def make_big_mail(n: int = 0) -> bytes:
    """About 41 MB: a short text and a 30 MB attachment (random, so nothing compresses it)."""
    message = EmailMessage()
    message["From"] = "Bench <bench@example.com>"
    message["To"] = "intake@example.com"
    message["Subject"] = f"bench big mail {n}"
    message["Message-ID"] = f"<bench-big-{n}@example.com>"
    message.set_content("scans attached\n")
    data = random.Random(41 + n).randbytes(BIG_ATTACHMENT_BYTES)
    message.add_attachment(data, maintype="application", subtype="pdf", filename="scans.pdf")
    return message.as_bytes().replace(b"\n", b"\r\n")


def _big_mail_round(
    database_url: str, port: int, state_dir: Path, folder: str, mails: int
) -> float:
    """A big-mail run in a child process; how many MiB its ``mails`` big mails, read in one
    poll, raised its peak RSS."""
    client = IMAPClient("127.0.0.1", port=port, ssl=False, timeout=60)
    size_mb = 0.0
    try:
        client.login(USER, PASSWORD)
        client.create_folder(folder)
        client.append(folder, make_mail(0))  # read first, to warm the child up
        for n in range(mails):
            big = make_big_mail(n)
            client.append(folder, big)
            size_mb += len(big) / 1e6
            del big
    finally:
        client.logout()
    child = subprocess.run(
        [
            sys.executable,
            __file__,
            "--big-mail-child",
            database_url,
            str(port),
            str(state_dir),
            folder,
            str(mails),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    figures = [line for line in child.stdout.splitlines() if line.startswith("BIG_MAIL ")]
    if child.returncode != 0 or not figures:
        raise SystemExit(f"big-mail run failed:\n{child.stdout}{child.stderr}")
    fields = dict(item.split("=", 1) for item in figures[-1].split()[1:])
    rise = float(fields["rss_rise_mib"])
    print(
        f"big mails: {mails} of {size_mb / mails:.1f} MB ingested in one poll, peak RSS "
        f"{fields['peak_mib']} MiB, {rise:.1f} MiB over the warm worker's {fields['before_mib']} MiB"
    )
    return rise


def big_mail_child(database_url: str, port: int, state_dir: Path, folder: str, mails: int) -> int:
    # batch_size 1 for the warm-up poll; the big mails' poll then reads them all at once.
    settings = _settings(database_url, port, state_dir, f"bench-{folder}", folder, 1)
    asyncio.run(_big_mail_intake(settings, mails))
    return 0


async def _big_mail_intake(settings: Settings, mails: int) -> None:
    engine = create_engine(settings.database)
    try:
        deps = IntakeDeps(
            sessions=create_sessionmaker(engine),
            store=build_store(settings),
            connect=ImapMailbox,
            nudge=_no_nudge,
        )
        name = settings.intake.mailboxes[0].name
        # The small mail first (batch_size 1): imports, pools and connections are warm.
        warm = await poll_mailbox(name, settings=settings.intake, deps=deps)
        settings.intake.mailboxes[0].batch_size = mails
        exact = _reset_peak_rss()
        before = _status_kib("VmRSS" if exact else "VmHWM")
        outcome = await poll_mailbox(name, settings=settings.intake, deps=deps)
        peak = _status_kib("VmHWM")
    finally:
        await engine.dispose()
    for done, expected in ((warm, 1), (outcome, mails)):
        if done.status != "done" or done.result is None or done.result.ingested != expected:
            raise SystemExit(f"intake did not store the mails: {done}")
    if not exact:
        print("warning: the peak RSS could not be reset; the figure is a lower bound")
    print(
        f"BIG_MAIL rss_rise_mib={(peak - before) / 1024:.1f} "
        f"before_mib={before / 1024:.0f} peak_mib={peak / 1024:.0f}"
    )


def _reset_peak_rss() -> bool:
    """Reset this process's VmHWM to its current RSS (Linux 4.0+); False when it cannot."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise SystemExit(f"/proc/self/status has no {field}")


if __name__ == "__main__":
    sys.exit(main())
