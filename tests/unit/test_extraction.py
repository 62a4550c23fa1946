"""Field extraction of the reference recognizer: layouts, names, confidence, broken input."""

from __future__ import annotations

import io
import zipfile
from datetime import date

import pytest
from openpyxl import Workbook

from mailroom.errors import EmptyFile, ExtractionError, UnreadableFile, UnsupportedType
from mailroom.recognition.contract.models import ResultField
from mailroom.recognizer.extraction import (
    CLEAN_CONFIDENCE,
    GARBLED_CONFIDENCE,
    extract,
    looks_like_text,
    normalise_name,
    read_table_pairs,
    score_value,
)


def xlsx_bytes(*sheets: list[list[object]]) -> bytes:
    workbook = Workbook()
    first = workbook.active
    assert first is not None
    for index, rows in enumerate(sheets):
        sheet = first if index == 0 else workbook.create_sheet(f"s{index}")
        for row in rows:
            sheet.append(row)
    buffer = io.BytesIO()
    workbook.save(buffer)
    return buffer.getvalue()


def values(extraction):
    return {name: field.value for name, field in extraction.fields.items()}


def test_csv_header_row_with_first_data_row():
    data = b"Invoice Number,Total,Currency\nA-1,10.50,EUR\nA-2,99,USD\n"
    extraction = extract(data, "csv")
    assert values(extraction) == {"invoice_number": "A-1", "total": "10.50", "currency": "EUR"}
    assert extraction.document_type == "invoice"
    assert all(f.confidence == CLEAN_CONFIDENCE for f in extraction.fields.values())


def test_csv_key_value_columns():
    data = b"Invoice Number,A-7\nTotal,12.00\nDue date,2030-01-01\n"
    extraction = extract(data, "CSV")
    assert values(extraction) == {
        "invoice_number": "A-7",
        "total": "12.00",
        "due_date": "2030-01-01",
    }
    assert extraction.document_type == "invoice"


def test_two_by_two_table_with_a_numeric_first_row_is_key_value():
    assert values(extract(b"total,10.5\nvendor,ACME\n", "csv")) == {
        "total": "10.5",
        "vendor": "ACME",
    }


def test_explicit_key_value_header_is_skipped():
    assert values(extract(b"key,value\nVendor,ACME\nTotal,3\n", "csv")) == {
        "vendor": "ACME",
        "total": "3",
    }


def test_semicolon_csv_and_quoted_cells():
    data = b'Vendor;"Amount; gross"\n"ACME, Inc.";5\n'
    assert values(extract(data, "csv")) == {"vendor": "ACME, Inc.", "amount_gross": "5"}


def test_tsv_with_utf8_bom():
    data = "\ufeffName\tCity\nJosé\tKöln\n".encode()
    assert values(extract(data, "tsv")) == {"name": "José", "city": "Köln"}


def test_leading_blank_rows_and_trailing_empty_cells_are_ignored():
    data = b"\n,,\nVendor,Total,,\nACME,4,,\n"
    assert values(extract(data, "csv")) == {"vendor": "ACME", "total": "4"}


def test_header_without_data_row_gives_unrecognized_fields():
    extraction = extract(b"vendor,total,currency\n", "csv")
    assert extraction.fields == {
        "vendor": ResultField(value=None, confidence=GARBLED_CONFIDENCE),
        "total": ResultField(value=None, confidence=GARBLED_CONFIDENCE),
        "currency": ResultField(value=None, confidence=GARBLED_CONFIDENCE),
    }
    assert extraction.document_type == "generic"


def test_duplicate_and_unnamed_columns():
    data = b"Total,,total,TOTAL\n1,2,3,4\n"
    assert values(extract(data, "csv")) == {"total": "1", "total_2": "3", "total_3": "4"}


def test_xlsx_header_layout_keeps_cell_types():
    data = xlsx_bytes(
        [["Invoice Number", "Total", "Paid", "Issued"], ["A-9", 10.5, True, date(2030, 1, 2)]]
    )
    extraction = extract(data, "xlsx")
    assert values(extraction) == {
        "invoice_number": "A-9",
        "total": 10.5,
        "paid": True,
        "issued": "2030-01-02T00:00:00",
    }
    assert extraction.document_type == "invoice"


def test_xlsx_key_value_layout_on_the_first_sheet_with_data():
    data = xlsx_bytes([], [["Vendor", "ACME"], ["Total", 12], ["Note", "#N/A"]])
    extraction = extract(data, "xlsx")
    assert values(extraction) == {"vendor": "ACME", "total": 12, "note": "#N/A"}
    assert extraction.fields["note"].confidence == GARBLED_CONFIDENCE
    assert extraction.fields["total"].confidence == CLEAN_CONFIDENCE


def test_plain_text_key_value_lines():
    data = b"Invoice number: INV-3\nTotal : 7.25\nthis line is prose\n: no key\nNote: a: b\n"
    extraction = extract(data, "txt")
    assert values(extraction) == {"invoice_number": "INV-3", "total": "7.25", "note": "a: b"}
    assert extraction.document_type == "invoice"


def test_text_without_pairs_extracts_nothing():
    extraction = extract(b"just some prose\n", "txt")
    assert extraction.fields == {}
    assert extraction.document_type == "generic"


def test_image_bytes_yield_no_fields():
    png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256))
    assert extract(png, "png").fields == {}


def test_image_that_is_really_text_is_read_as_text():
    assert values(extract(b"Vendor: ACME\n", "pdf")) == {"vendor": "ACME"}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Invoice Number", "invoice_number"),
        ("InvoiceNumber", "invoice_number"),
        ("invoice-number", "invoice_number"),
        ("  Total (EUR) ", "total_eur"),
        ("VAT ID", "vat_id"),
        ("HTTPServer", "http_server"),
        ("Straße", "strasse"),
        ("Größe", "grosse"),
        ("__x__", "x"),
        ("???", ""),
    ],
)
def test_field_names_are_lower_snake_case(name, expected):
    assert normalise_name(name) == expected


def test_ascii_folding_of_accented_names():
    assert normalise_name("Café Total") == "cafe_total"


@pytest.mark.parametrize(
    ("raw", "confidence", "value"),
    [
        ("ACME", CLEAN_CONFIDENCE, "ACME"),
        ("  10.50 ", CLEAN_CONFIDENCE, "10.50"),
        (0, CLEAN_CONFIDENCE, 0),
        ("", GARBLED_CONFIDENCE, None),
        ("   ", GARBLED_CONFIDENCE, None),
        (None, GARBLED_CONFIDENCE, None),
        ("?", GARBLED_CONFIDENCE, "?"),
        ("???", GARBLED_CONFIDENCE, "???"),
        ("#N/A", GARBLED_CONFIDENCE, "#N/A"),
        ("#div/0!", GARBLED_CONFIDENCE, "#div/0!"),
        ("AC\ufffdME", GARBLED_CONFIDENCE, "AC\ufffdME"),
        ("A\x07B", GARBLED_CONFIDENCE, "A\x07B"),
    ],
)
def test_confidence_is_low_for_empty_or_garbled_values(raw, confidence, value):
    assert score_value(raw) == ResultField(value=value, confidence=confidence)


@pytest.mark.parametrize(
    ("data", "file_type", "error", "code"),
    [
        (b"", "csv", EmptyFile, "EMPTY"),
        (b"\n\n  \n", "csv", EmptyFile, "EMPTY"),
        (b",,,\n,,\n", "csv", EmptyFile, "EMPTY"),
        (b"   ", "txt", EmptyFile, "EMPTY"),
        (b"", "png", EmptyFile, "EMPTY"),
        (b"\xff\xfeA", "csv", UnreadableFile, "UNREADABLE"),
        (b"caf\xe9,total\n1,2\n", "csv", UnreadableFile, "UNREADABLE"),
        (b"a,b\x00c\n", "tsv", UnreadableFile, "UNREADABLE"),
        (b'a,"b\n1,2', "csv", UnreadableFile, "UNREADABLE"),
        (b"plain text, not a workbook", "xlsx", UnreadableFile, "UNREADABLE"),
        (b"PK\x03\x04broken zip", "xlsx", UnreadableFile, "UNREADABLE"),
        (b"\xd0\xcf\x11\xe0 old excel", "xls", UnsupportedType, "UNSUPPORTED_TYPE"),
        (b"<html></html>", "html", UnsupportedType, "UNSUPPORTED_TYPE"),
    ],
)
def test_broken_input_raises_a_coded_error(data, file_type, error, code):
    with pytest.raises(error) as caught:
        extract(data, file_type)
    assert isinstance(caught.value, ExtractionError)
    assert caught.value.code == code
    assert str(caught.value)


def test_zip_that_is_not_a_workbook_is_unreadable():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("hello.txt", "not a workbook")
    with pytest.raises(UnreadableFile):
        extract(buffer.getvalue(), "xlsx")


def test_empty_workbook_is_empty():
    with pytest.raises(EmptyFile):
        extract(xlsx_bytes([]), "xlsx")


def test_read_table_pairs_single_row_of_two_is_a_pair():
    assert read_table_pairs([["Vendor", "ACME"]]) == [("Vendor", "ACME")]


def test_looks_like_text():
    assert looks_like_text(b"Total: 5\r\n")
    assert not looks_like_text(b"\x89PNG\r\n\x1a\n")
    assert not looks_like_text(b"a\x01b")


def test_workbook_with_a_malformed_sheet_is_unreadable():
    source = zipfile.ZipFile(io.BytesIO(xlsx_bytes([["a", "b"], [1, 2]])))
    buffer = io.BytesIO()
    with source, zipfile.ZipFile(buffer, "w") as target:
        for item in source.infolist():
            body = source.read(item)
            if item.filename.startswith("xl/worksheets/"):
                body = b"<worksheet><sheetData><row><c r='A1'><v>1</v"
            target.writestr(item, body)
    with pytest.raises(UnreadableFile):
        extract(buffer.getvalue(), "xlsx")
