"""``encoding``: reading CSV and JSONL files in another codec, and the UTF-8 error that names it."""

from __future__ import annotations

import re

import pytest

from labelrl.data import load_dataset
from labelrl.data.load import check_encoding, likely_encoding

ACCENTED = ["café crème", "naïve", "señor £5"]


def write_csv(path, encoding: str):
    path.write_bytes(("text,label\n" + "".join(f"{t},{'ab'[i % 2]}\n" for i, t in enumerate(ACCENTED))).encode(encoding))
    return path


@pytest.mark.parametrize("encoding", ["latin-1", "cp1252", "utf-16"])
def test_a_file_in_another_encoding_reads_with_encoding(tmp_path, encoding):
    path = write_csv(tmp_path / "x.csv", encoding)
    assert [ex.text for ex in load_dataset(path, encoding=encoding).examples] == ACCENTED


def test_jsonl_takes_the_encoding_too(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes('{"text": "café", "label": "a"}\n{"text": "thé", "label": "b"}\n'.encode("latin-1"))
    assert [ex.text for ex in load_dataset(path, encoding="latin-1").examples] == ["café", "thé"]


def test_the_default_is_utf8_and_drops_a_bom(tmp_path):
    path = tmp_path / "x.csv"
    path.write_bytes("\ufefftext,label\ncafé,a\nthé,b\n".encode("utf-8"))
    dataset = load_dataset(path)
    assert dataset.examples[0].text == "café" and "text" in dataset.examples[0].fields


@pytest.mark.parametrize("data, guess", [
    # 0xe9 (é) and 0x80 (€ in cp1252) are not UTF-8; cp1252 decodes both
    (b"text,label\ncaf\xe9,a\n\x80 5,b\n", "cp1252"),
    # 0x81 is undefined in cp1252, so only latin-1 (which decodes every byte) is left
    (b"text,label\ncaf\xe9,a\nx\x81,b\n", "latin-1"),
    # a UTF-16 byte-order mark says which it is
    ("text,label\ncafé,a\n".encode("utf-16"), "utf-16"),
])
def test_a_non_utf8_file_names_the_encoding_it_decodes_as_and_the_flag(tmp_path, data, guess):
    path = tmp_path / "x.csv"
    path.write_bytes(data)
    with pytest.raises(ValueError, match="is not valid UTF-8") as info:
        load_dataset(path)
    assert f"it decodes as {guess}: pass --encoding {guess} (or re-save the file as UTF-8)" in str(info.value)
    assert likely_encoding(data) == guess


def test_a_byte_the_given_encoding_cannot_decode_names_it(tmp_path):
    path = tmp_path / "x.csv"
    path.write_bytes(b"text,label\nx\x81,a\ny,b\n")  # 0x81: undefined in cp1252
    with pytest.raises(ValueError, match=r"byte offset 12 \(line 2\) is not valid cp1252 \(b'\\x81'\); .*--encoding"):
        load_dataset(path, encoding="cp1252")


@pytest.mark.parametrize("name", ["latin-9000", "base64", "rot13", ""])
def test_a_name_that_is_no_text_codec_is_refused_by_name(tmp_path, name):
    path = write_csv(tmp_path / "x.csv", "utf-8")
    with pytest.raises(ValueError, match=re.escape(f"--encoding {name!r}: not a text encoding") + ".*latin-1"):
        load_dataset(path, encoding=name)
    assert check_encoding("Latin-1") == check_encoding("iso-8859-1") == "iso8859-1"


def test_encoding_applies_to_text_files_only(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"text": ["a", "b"], "label": ["x", "y"]}), path)
    with pytest.raises(ValueError, match=r"--encoding 'latin-1' applies to \.csv and \.jsonl files.*drop --encoding"):
        load_dataset(path, encoding="latin-1")
    with pytest.raises(ValueError, match=r"sms-spam is a built-in dataset; drop --encoding"):
        load_dataset("sms-spam", encoding="latin-1")
    assert len(load_dataset(path, encoding="utf8").examples) == 2  # naming the default is no error
