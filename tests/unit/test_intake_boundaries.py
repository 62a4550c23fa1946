"""The feed parser's boundary lines matched without a compile per boundary, as the stdlib does."""

from __future__ import annotations

import email
import email.feedparser
import inspect
import re
from email import policy
from email.message import Message

import pytest

from mailroom.intake import boundaries
from mailroom.intake.boundaries import BoundaryPattern, compile_pattern
from mailroom.intake.parsing import Limits, parse_mail

BOUNDARIES = ["B", "===============7555740845355794981==", "a+b(c)?.*[x]", "x\\y$^|{2}"]


def _stdlib_pattern(boundary: str) -> str:
    """The pattern ``email.feedparser`` builds for ``boundary`` (Python 3.11 to 3.13)."""
    return (
        "(?P<sep>"
        + re.escape("--" + boundary)
        + r")(?P<end>--)?(?P<ws>[ \t]*)(?P<linesep>\r\n|\r|\n)?$"
    )


def test_the_stdlib_still_builds_the_pattern_recognized():
    # A Python whose parser spells the pattern otherwise would parse right but compile again.
    assert r")(?P<end>--)?(?P<ws>[ \t]*)(?P<linesep>\r\n|\r|\n)?$'" in inspect.getsource(
        email.feedparser
    )
    for boundary in BOUNDARIES:
        assert isinstance(compile_pattern(_stdlib_pattern(boundary)), BoundaryPattern)


@pytest.mark.parametrize("boundary", BOUNDARIES)
@pytest.mark.parametrize(
    "rest", ["", "--", "--\r\n", "\r\n", "\n", "\r", " \t\r\n", "--  \n", "x", "--x", " x", "-"]
)
def test_a_line_matches_as_the_compiled_pattern_does(boundary: str, rest: str):
    real = re.compile(_stdlib_pattern(boundary))
    ours = compile_pattern(_stdlib_pattern(boundary))
    for line in ("--" + boundary + rest, "x--" + boundary + rest, "--" + boundary[:-1] + rest):
        expected, got = real.match(line), ours.match(line)
        assert bool(got) == bool(expected), line
        if expected is not None:
            assert got is not None
            for group in (0, "sep", "end", "ws", "linesep"):
                assert got.group(group) == expected.group(group), (line, group)
            assert got.group("end", "linesep") == expected.group("end", "linesep")
            # Anything beyond the groups comes from the real match.
            assert got.span() == expected.span() and got.group(2) == expected.group(2)


def test_other_patterns_compile_as_before():
    assert compile_pattern(r"a+b") == re.compile(r"a+b")
    # The shape with a pattern inside instead of an escaped separator is no boundary.
    assert isinstance(
        compile_pattern(r"(?P<sep>a+)(?P<end>--)?(?P<ws>[ \t]*)(?P<linesep>\r\n|\r|\n)?$"),
        re.Pattern,
    )


def _mails() -> list[bytes]:
    nested = (
        b'Content-Type: multipart/mixed; boundary="a+b(c)?"\r\n\r\n'
        b"preamble line\r\n\r\n--a+b(c)?\r\nContent-Type: text/plain\r\n\r\nbody\r\n"
        b"--a+b(c)?\r\nContent-Type: multipart/alternative; boundary=inner\r\n\r\n"
        b"--inner\r\nContent-Type: text/plain\r\n\r\nplain\r\n--inner \t\r\n"
        b"Content-Type: text/html\r\n\r\n<p>html</p>\r\n--inner--\r\n"
        b"--a+b(c)?\r\n--a+b(c)?\r\nContent-Type: text/csv\r\n"
        b"Content-Disposition: attachment; filename=x.csv\r\n\r\na,b\r\n1,2\r\n"
        b"--a+b(c)?--  \r\nepilogue\r\n"
    )
    unclosed = (
        b"Content-Type: multipart/mixed; boundary=B\n\n--B\nContent-Type: text/plain\n\n"
        b"no close --B here\n--Bx\nstill body\n"
    )
    bare_cr = b"Content-Type: multipart/mixed; boundary=B\r\rpre\r--B\rContent-Type: text/plain\r\rx\r--B--"
    return [nested, unclosed, bare_cr]


def _tree(message: Message) -> list[object]:
    parts = []
    for part in message.walk():
        payload = None if part.is_multipart() else part.get_payload()
        parts.append(
            (
                part.get_content_type(),
                payload,
                part.preamble,
                part.epilogue,
                [type(d).__name__ for d in part.defects],
            )
        )
    return parts


@pytest.mark.parametrize("raw", _mails())
def test_mails_parse_as_with_the_stdlib_re(raw: bytes, monkeypatch: pytest.MonkeyPatch):
    boundaries.install()
    ours = email.message_from_bytes(raw, policy=policy.compat32)
    monkeypatch.setattr(email.feedparser, "re", re)
    stdlib = email.message_from_bytes(raw, policy=policy.compat32)
    assert _tree(ours) == _tree(stdlib)
    assert ours.as_bytes() == stdlib.as_bytes()


def test_parse_mail_uses_no_compile_per_boundary(monkeypatch: pytest.MonkeyPatch):
    limits = Limits(max_attachment_bytes=10_000, max_mail_bytes=100_000, max_attachments=10)
    compiled: list[object] = []
    real_compile = re.compile

    def counting(pattern: object, flags: int = 0) -> object:
        compiled.append(pattern)
        return real_compile(pattern, flags)  # type: ignore[call-overload]

    monkeypatch.setattr(re, "compile", counting)
    parsed = parse_mail(_mails()[0], limits)
    assert [a.name for a in parsed.attachments] == ["x.csv"]
    assert compiled == []
