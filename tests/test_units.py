import pytest

from hiercoll.errors import HiercollError
from hiercoll.units import format_size, parse_size, parse_size_range


@pytest.mark.parametrize("text,value", [("4096", 4096), ("64KiB", 65536), ("1GiB", 1 << 30),
                                        ("1GB", 10**9), ("1.5KiB", 1536), ("16m", 16 << 20)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "abc", "12XB", "-4", "0.3"])
def test_parse_size_rejects(text):
    with pytest.raises(HiercollError, match="size"):
        parse_size(text)


def test_ranges():
    assert parse_size_range("4KiB:64KiB") == [4096, 8192, 16384, 32768, 65536]
    assert parse_size_range("1KiB:16KiB:4") == [1024, 4096, 16384]
    assert parse_size_range("1,2KiB") == [1, 2048]
    with pytest.raises(HiercollError, match="LOW <= HIGH"):
        parse_size_range("64KiB:4KiB")


def test_format_size():
    assert format_size(65536) == "64KiB"
    assert format_size(1000) == "1000B"
    assert format_size(3 << 30) == "3GiB"
