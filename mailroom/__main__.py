"""``python -m mailroom`` is the ``mailroom`` command."""

from mailroom.cli import app

app(prog_name="mailroom")
