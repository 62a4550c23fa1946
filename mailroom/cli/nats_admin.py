"""`mailroom nats setup`: the administrator's step that makes the stream and the inbox consumer.

Run it once per install, and again after changing the subjects, with a NATS login that may
manage JetStream (``deploy/nats-server.conf``: ``mailroom-admin``). Mailroom's processes then
run with ``nats.manage_stream`` false under a user that may only publish requests, read its
consumer and ack it: no process that runs all day can edit the stream.
"""

from __future__ import annotations

import asyncio

import typer

from mailroom.cli import errors
from mailroom.errors import NatsConfigError, NatsPublishFailed
from mailroom.settings import NatsSettings

app = typer.Typer(no_args_is_help=True, help="Set up NATS for Mailroom (an administrator's step).")


@app.command()
def setup() -> None:
    """Create or align the JetStream stream and create the inbox consumer, then say what they are.

    Uses the NATS settings (MAILROOM_NATS__*) with a login that may manage JetStream; the
    processes run afterwards with MAILROOM_NATS__MANAGE_STREAM=false and their own user.
    """
    from mailroom.cli import load_settings

    settings = load_settings("cli")
    if not settings.nats.jetstream:
        typer.echo(
            "mailroom: nats setup: nats.jetstream is false: core NATS has no stream or "
            "consumer to set up",
            err=True,
        )
        raise typer.Exit(errors.EXIT_CONFIG)
    managed = settings.nats.model_copy(update={"manage_stream": True})
    try:
        lines = asyncio.run(_set_up(managed))
    except NatsPublishFailed as exc:
        # NOTE: NATS does not answer a call the login may not make; it only logs the violation.
        typer.echo(
            f"mailroom: nats setup: {exc}: NATS did not answer; a login that may not manage "
            f"JetStream gets no answer (nats.user is {managed.user or 'not set'!r}; "
            "deploy/nats-server.conf's administrator is mailroom-admin)",
            err=True,
        )
        raise typer.Exit(errors.EXIT_UNAVAILABLE) from None
    except NatsConfigError as exc:
        typer.echo(f"mailroom: nats setup: {exc}", err=True)
        raise typer.Exit(errors.EXIT_CONFIG) from None
    for line in lines:
        typer.echo(line)


async def _set_up(nats_settings: NatsSettings) -> list[str]:
    from mailroom.adapters.nats import NatsClient

    client = NatsClient(nats_settings, name="mailroom-nats-setup")
    await client.connect()  # with manage_stream: creates the stream or adds its subjects
    try:
        return await client.set_up()
    finally:
        await client.close()
