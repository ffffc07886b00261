from fractions import Fraction

import pytest

from pytest_memlab.sizes import SizeError, format_size, parse_size, parse_tolerance


@pytest.mark.parametrize(
    "text, expected",
    [
        (0, 0), (123, 123), ("512", 512), ("512B", 512), ("512 B", 512),
        ("2K", 2048), ("2M", 2 * 2**20), ("2G", 2 * 2**30), ("1T", 2**40),
        ("2KiB", 2048), ("3 MiB", 3 * 2**20), ("1.5 GiB", 1610612736), ("2TiB", 2 * 2**40),
        ("10kB", 10_000), ("3MB", 3_000_000), ("2.5 GB", 2_500_000_000), ("1TB", 10**12),
        (".5K", 512), ("1.1G", 1181116006),  # rounded down: same verdicts as the exact budget
    ],
)
def test_sizes_parse_as_designed(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "bad, words",
    [
        ("2X", "unknown unit 'X'"), ("1 KB", "unknown unit 'KB'"), ("1kib", "unknown unit"),
        ("-1G", "negative"), (-5, "negative"), ("1.5  GiB", "not a size"), ("", "not a size"),
        ("G", "not a size"), ("1e3", "not a size"), (1.5, "not float"), (True, "not a size"),
        (None, "NoneType"),
    ],
)
def test_bad_sizes_name_the_value(bad, words):
    with pytest.raises(SizeError, match=words.replace("(", r"\(")) as info:
        parse_size(bad)
    assert repr(bad) in str(info.value)


@pytest.mark.parametrize(
    "n, text",
    [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (8 * 2**20, "8.0 MiB"), (316 * 2**20, "316.0 MiB"),
     (2480209920, "2.31 GiB"), (-2**20, "-1.0 MiB"), (None, "n/a"), (3 * 2**40, "3.00 TiB")],
)
def test_format_size_in_iec_units(n, text):
    assert format_size(n) == text


def test_tolerance_takes_the_larger_of_percent_and_size():
    t = parse_tolerance("5%,1MiB")
    assert t.fraction == Fraction(1, 20) and t.absolute == 2**20
    assert t.allowed(100 * 2**20) == 5 * 2**20
    assert t.allowed(2**20) == 2**20
    assert parse_tolerance("16MiB").allowed(10**12) == 16 * 2**20
    assert parse_tolerance("2%").allowed(1000) == 20


@pytest.mark.parametrize("bad", ["", "x%", "5%,6%", "1M,2M", "-3%", "5%,2Q", 5])
def test_bad_tolerances_are_named(bad):
    with pytest.raises(SizeError, match="tolerance"):
        parse_tolerance(bad)
