"""Archives opened like forwarded mails: members under the archive, limits before and while."""

from __future__ import annotations

import io
import tarfile
import zipfile
from dataclasses import replace
from email.mime.application import MIMEApplication
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText

from mailroom.intake.archives import split_member_name
from mailroom.intake.parsing import Limits, parse_mail

LIMITS = Limits(max_attachment_bytes=10_000_000, max_mail_bytes=50_000_000, max_attachments=100)
CSV = b"invoice,total\nA-1,10\n"
PDF = b"%PDF-1.4\n" + b"x" * 100


def _zip(members: dict[str, bytes], *, level: int = 6) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=level) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def _tar(members: dict[str, bytes], mode: str = "w:gz") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _mail(name: str, data: bytes, media_type: str = "application/zip") -> bytes:
    mail = MIMEMultipart()
    mail["Subject"], mail["From"], mail["Message-ID"] = "zipped", "a@example.com", "<z@x>"
    mail.attach(MIMEText("invoices attached"))
    part = MIMEApplication(data)
    part.replace_header("Content-Type", media_type)
    part.add_header("Content-Disposition", "attachment", filename=name)
    mail.attach(part)
    return mail.as_bytes()


def test_zip_members_become_files_under_the_archive_with_their_folders():
    data = _zip({"2026/11/invoice.csv": CSV, "scan.pdf": PDF, "2026/": b""})
    archive, invoice, scan = parse_mail(_mail("invoices.zip", data), LIMITS).attachments
    assert (archive.file_type, archive.container_reason, archive.check_reason) == (
        "zip",
        "archive (zip): 2 files extracted",
        None,
    )
    assert archive.data == data, "the archive itself is stored whole"
    assert [(f.name, f.path, f.pipeline, f.data, f.parent) for f in (invoice, scan)] == [
        ("invoice.csv", "invoices.zip/2026/11/invoice.csv", "tabular", CSV, 0),
        ("scan.pdf", "invoices.zip/scan.pdf", "image", PDF, 0),
    ]


def test_tar_and_tar_gz_are_opened_too():
    for name, mode in (("docs.tar", "w"), ("docs.tar.gz", "w:gz"), ("docs.tgz", "w:gz")):
        data = _tar({"a/invoice.csv": CSV}, mode)
        archive, invoice = parse_mail(_mail(name, data, "application/x-tar"), LIMITS).attachments
        assert archive.container_reason == "archive (tar): 1 file extracted", name
        assert (invoice.path, invoice.data) == (f"{name}/a/invoice.csv", CSV)


def test_an_xlsx_is_a_document_not_an_archive():
    data = _zip({"xl/workbook.xml": b"<workbook/>", "[Content_Types].xml": b"<Types/>"})
    mail = _mail("rates.xlsx", data, "application/octet-stream")
    (workbook,) = parse_mail(mail, LIMITS).attachments
    assert (workbook.file_type, workbook.pipeline, workbook.container_reason) == (
        "xlsx",
        "tabular",
        None,
    )


def test_zip_slip_names_lose_every_part_that_climbs_or_roots():
    data = _zip({"../../etc/passwd.csv": CSV, "/abs/x.csv": CSV, "..\\..\\win.csv": CSV})
    _, *files = parse_mail(_mail("evil.zip", data), LIMITS).attachments
    assert [(f.name, f.path) for f in files] == [
        ("passwd.csv", "evil.zip/etc/passwd.csv"),
        ("x.csv", "evil.zip/abs/x.csv"),
        ("win.csv", "evil.zip/win.csv"),
    ]
    assert split_member_name("../..") == ("", "")


def test_a_zip_bomb_is_refused_before_decompressing_and_waits_for_an_operator():
    bomb = _zip({"zeros.csv": b"0" * 30_000_000}, level=9)
    assert len(bomb) < 100_000
    limits = replace(LIMITS, max_attachment_bytes=50_000_000)  # a member under it is read
    (archive,) = parse_mail(_mail("bomb.zip", bomb), limits).attachments
    assert archive.container_reason is None and archive.skip_reason is None
    assert archive.check_reason.startswith("archive (zip) could not be opened: declares 30000000")
    assert "compression ratio limit of 100" in archive.check_reason


def test_a_nested_bomb_stops_at_the_mails_budget():
    inner = _zip({"zeros.csv": b"0" * 4_000_000}, level=9)
    outer = _zip({f"part{i}.zip": inner for i in range(6)}, level=0)
    limits = replace(LIMITS, max_archive_ratio=100_000, max_archive_bytes=10_000_000)
    files = parse_mail(_mail("nested.zip", outer), limits).attachments
    inner_zips = [f for f in files if f.name.startswith("part")]
    assert len(inner_zips) == 6
    opened = [f for f in inner_zips if f.container_reason]
    refused = [f for f in inner_zips if f.check_reason]
    # The outer zip's bytes (6 small zips) count too: the budget holds two inner ones.
    assert (len(opened), len(refused)) == (2, 4)
    assert "bytes its mail's archives may still expand to" in refused[0].check_reason
    assert sum(len(f.data) for f in files if f.name == "zeros.csv") == 8_000_000


def test_archives_nested_deeper_than_the_limit_are_kept_unopened():
    data = _zip({"invoice.csv": CSV})
    for level in range(4):
        data = _zip({f"level{level}.zip": data})
    files = parse_mail(_mail("deep.zip", data), replace(LIMITS, max_nesting=3)).attachments
    assert [f.name for f in files] == ["deep.zip", "level3.zip", "level2.zip", "level1.zip"]
    assert files[-1].skip_reason == "archive (zip) nested deeper than 3 levels: kept unopened"


def test_too_many_members_refuse_the_archive():
    data = _zip({f"{i}.csv": CSV for i in range(30)})
    (archive,) = parse_mail(
        _mail("many.zip", data), replace(LIMITS, max_archive_members=20)
    ).attachments
    assert archive.check_reason == (
        "archive (zip) could not be opened: holds more files than the 20 its mail's archives "
        "may still yield"
    )


def test_encrypted_members_are_skipped_with_the_reason():
    data = bytearray(_zip({"secret.csv": CSV, "open.csv": CSV}))
    # Set the "encrypted" flag (bit 0) on the first member, in its local and central headers.
    for signature, offset in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        at = data.find(signature)
        data[at + offset] |= 0x1
    _, secret, plain = parse_mail(_mail("mixed.zip", bytes(data)), LIMITS).attachments
    assert (secret.name, secret.skip_reason, secret.data, secret.pipeline) == (
        "secret.csv",
        "encrypted in its archive: it cannot be read without the password",
        b"",
        "tabular",
    )
    assert (plain.skip_reason, plain.data) == (None, CSV)


def test_a_member_packed_with_a_method_zipfile_lacks_is_skipped_with_the_reason():
    data = bytearray(_zip({"odd.csv": CSV, "open.csv": CSV}))
    # Mark the first member as PPMd-compressed (method 98), in its local and central headers.
    for signature, offset in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):
        at = data.find(signature)
        data[at + offset : at + offset + 2] = (98).to_bytes(2, "little")
    _, odd, plain = parse_mail(_mail("mixed.zip", bytes(data)), LIMITS).attachments
    assert odd.name == "odd.csv" and odd.data == b""
    assert odd.skip_reason.startswith("not readable: "), odd.skip_reason
    assert (plain.skip_reason, plain.data) == (None, CSV)


def test_a_corrupt_archive_waits_for_an_operator():
    (archive,) = parse_mail(_mail("broken.zip", b"PK\x03\x04 not really"), LIMITS).attachments
    assert archive.check_reason.startswith("archive (zip) could not be opened: not a readable zip")


def test_a_member_over_the_attachment_limit_is_listed_never_decompressed():
    data = _zip({"big.csv": b"a,b\n" * 5000, "small.csv": CSV})
    limits = replace(LIMITS, max_attachment_bytes=1000)
    _, big, small = parse_mail(_mail("two.zip", data), limits).attachments
    assert (big.size, big.data, big.skip_reason) == (
        20000,
        b"",
        "attachment of 20000 bytes exceeds the limit of 1000",
    )
    assert small.data == CSV


def test_member_names_without_the_utf8_flag_are_read_in_the_mails_charsets():
    mail = _mail("票据.zip", _zip_with_raw_name("发票.csv".encode("gbk"), CSV))
    mail = mail.replace(b'charset="us-ascii"', b'charset="gbk"', 1)
    _, member = parse_mail(mail, LIMITS).attachments
    assert member.name == "发票.csv"


def _zip_with_raw_name(raw_name: bytes, data: bytes) -> bytes:
    """A stored zip whose one member's name is ``raw_name`` bytes, without the UTF-8 flag."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(zipfile.ZipInfo("N" * len(raw_name)), data)
    return buffer.getvalue().replace(b"N" * len(raw_name), raw_name)


def test_a_member_larger_than_its_header_says_is_refused_while_decompressing():
    data = bytearray(_zip({"zeros.csv": b"0" * 3_000_000}))
    # Claim 100 bytes in both headers: the reader stops there and the checksum fails.
    for signature, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        at = data.find(signature)
        data[at + offset : at + offset + 4] = (100).to_bytes(4, "little")
    (archive,) = parse_mail(_mail("liar.zip", bytes(data)), LIMITS).attachments
    assert archive.check_reason.startswith("archive (zip) could not be opened: not a readable zip")


def test_a_tar_gz_bomb_is_refused_while_its_stream_is_decompressed():
    bomb = _tar({f"{i}.csv": b"0" * 20_000 for i in range(200)})
    assert len(bomb) < 40_000
    (archive,) = parse_mail(_mail("bomb.tar.gz", bomb), LIMITS).attachments
    assert archive.check_reason.startswith("archive (tar) could not be opened: ")
    assert "compression ratio limit of 100" in archive.check_reason


def test_a_7z_archive_is_kept_unopened_as_a_skipped_file():
    seven = b"7z\xbc\xaf\x27\x1c\x00\x04" + b"\x00" * 100
    (archive,) = parse_mail(
        _mail("invoices.7z", seven, "application/x-7z-compressed"), LIMITS
    ).attachments
    assert (archive.file_type, archive.skip_reason, archive.container_reason) == (
        "7z",
        "file type '7z' is not recognized",
        None,
    )
