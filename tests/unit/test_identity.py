"""The host-pid identity every process shows to the others."""

from __future__ import annotations

import os
import socket

from mailroom.delivery.locks import LockOwner
from mailroom.process.identity import host_pid


def test_host_pid_names_the_host_and_the_process():
    assert host_pid() == f"{socket.gethostname()}-{os.getpid()}"


def test_a_lock_owner_is_named_by_host_pid_unless_told_otherwise():
    assert LockOwner().name == host_pid()
    assert LockOwner("elsewhere-1").name == "elsewhere-1"
