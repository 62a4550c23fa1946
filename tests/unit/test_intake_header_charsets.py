# ruff: noqa: RUF001  (full-width punctuation is what these charsets write)
"""Headers in every charset: raw 8-bit headers and misdeclared encoded words, read as written.

Each mail looks like one its charset's users send: headers written raw in the local charset
and a text body that declares it, which is the hint the headers are read with.
"""

from __future__ import annotations

import base64

import pytest

from mailroom.intake.charsets import decode_unlabelled
from mailroom.intake.parsing import Limits, parse_mail

LIMITS = Limits(max_attachment_bytes=100_000, max_mail_bytes=1_000_000, max_attachments=20)


def _raw_mail(charset: str, name: str, subject: str, body: str, *, codec: str = "") -> bytes:
    """A mail with its From name and Subject raw in ``codec`` and a body declaring ``charset``."""
    codec = codec or charset

    def raw(text: str) -> bytes:
        return text.encode(codec)

    return (
        b'From: "' + raw(name) + b'" <sender@example.com>\r\n'
        b"To: intake@example.com\r\n"
        b"Subject: " + raw(subject) + b"\r\n"
        b"Message-ID: <corpus@example.com>\r\n"
        b"MIME-Version: 1.0\r\n"
        b"Content-Type: text/plain; charset=" + charset.encode() + b"\r\n"
        b"Content-Transfer-Encoding: 8bit\r\n\r\n" + raw(body) + b"\r\n"
    )


CORPUS = [
    (
        "windows-1252",
        "Jürgen Müller",
        "Rechnung März – Müller & Söhne",
        "Sehr geehrte Damen und Herren, anbei die Rechnung für März.",
    ),
    (
        "iso-8859-2",
        "Łukasz Żółkiewski",
        "Faktura VAT za październik, Łódź",
        "Dzień dobry, w załączniku przesyłam fakturę za październik.",
    ),
    ("gbk", "张伟", "发票通知 十一月", "您好，附件是十一月的发票，请查收。"),
    # Clients declare GB2312 for GB18030 text: 䶮 is in neither GB2312 nor GBK.
    ("gb2312", "陈䶮", "基金净值通知 十一月", "您好，附件是本月的基金净值表。", "gb18030"),
    ("gb18030", "刘䶮", "申购确认书 二〇二六年十一月", "申购确认书见附件。"),
    ("big5", "陳大文", "發票通知 十一月份 請查收", "您好，附件是十一月份的發票，請查收。"),
    (
        "shift_jis",
        "山田太郎",
        "請求書のご送付（十一月分）",
        "いつもお世話になっております。請求書をお送りします。",
    ),
    ("euc-kr", "김철수", "청구서 안내 11월분", "안녕하세요. 11월분 청구서를 보내드립니다."),
    ("koi8-r", "Иван Петров", "Счёт-фактура за ноябрь", "Добрый день! Счёт-фактура во вложении."),
    ("utf-8", "José Álvarez", "Überweisung Łódź 发票 請求書", "Adjunto la factura."),
]


@pytest.mark.parametrize(
    ("charset", "name", "subject", "body", "codec"),
    [(*case, "") if len(case) == 4 else case for case in CORPUS],
    ids=[case[0] + ("-as-" + case[4] if len(case) == 5 else "") for case in CORPUS],
)
def test_raw_8bit_subject_and_sender_name_decode_exactly(charset, name, subject, body, codec):
    parsed = parse_mail(_raw_mail(charset, name, subject, body, codec=codec), LIMITS)
    assert (parsed.subject, parsed.sender_name, parsed.sender) == (
        subject,
        name,
        "sender@example.com",
    )


def _b64_word(charset: str, data: bytes) -> bytes:
    return b"=?" + charset.encode() + b"?b?" + base64.b64encode(data) + b"?="


def test_an_encoded_word_whose_bytes_are_not_its_declared_charset_is_read_with_the_mails():
    subject = "发票通知 十一月"
    raw = _raw_mail("gbk", "张伟", "x", "附件是发票。").replace(
        b"Subject: x", b"Subject: " + _b64_word("utf-8", subject.encode("gbk"))
    )
    assert parse_mail(raw, LIMITS).subject == subject


def test_an_encoded_gb2312_word_is_read_as_gb18030():
    raw = _raw_mail("utf-8", "a", "x", "b").replace(
        b"Subject: x", b"Subject: " + _b64_word("gb2312", "陈䶮 基金".encode("gb18030"))
    )
    assert parse_mail(raw, LIMITS).subject == "陈䶮 基金"


def test_an_encoded_name_with_a_comma_stays_one_name():
    raw = _raw_mail("utf-8", "a", "x", "b").replace(
        b'From: "a"', b"From: =?utf-8?q?M=C3=BCller=2C_Hans?="
    )
    parsed = parse_mail(raw, LIMITS)
    assert (parsed.sender_name, parsed.sender) == ("Müller, Hans", "sender@example.com")


def test_the_charsets_of_the_other_headers_encoded_words_are_hints_too():
    raw = (
        b"From: " + "张伟".encode("gbk") + b" <z@example.com>\r\n"
        b"Subject: =?gbk?b?" + base64.b64encode("发票".encode("gbk")) + b"?=\r\n\r\nbody\r\n"
    )
    parsed = parse_mail(raw, LIMITS)
    assert (parsed.sender_name, parsed.subject) == ("张伟", "发票")


def test_without_a_hint_a_long_enough_header_is_detected_a_short_one_is_replaced():
    long_subject = "发票通知 十一月 请查收附件"
    assert decode_unlabelled(long_subject.encode("gbk")) == long_subject
    # Two characters fit GBK, Big5 and Shift_JIS alike: no guess, replacement characters.
    assert decode_unlabelled("张三".encode("gbk")) == "\ufffd\ufffd\ufffd\ufffd"
    assert decode_unlabelled("Grüße".encode()) == "Grüße"


def test_a_hint_that_cannot_read_the_bytes_is_passed_over():
    # A mail declaring Big5 whose raw header is GBK: Big5 cannot read it, detection can.
    subject = "发票通知 十一月 请查收附件"
    assert decode_unlabelled(subject.encode("gbk"), ["big5"]) == subject


def test_utf8_with_a_stray_byte_stays_utf8_with_one_replacement_character():
    data = "发票通知 十一月".encode() + b"\xff"
    assert decode_unlabelled(data, ["gbk"]) == "发票通知 十一月\ufffd"
