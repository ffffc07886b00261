"""Byte sizes as users write them, and as the plugin prints them.

Parsing follows the README ("Markers") exactly: ``K M G T`` and ``KiB MiB GiB TiB`` are
powers of 1024, ``kB MB GB TB`` powers of 1000, ``B`` or no unit is bytes;
decimals and one space between number and unit are allowed.  A budget that is
not a whole number of bytes is rounded down, which decides every comparison
with a (whole) measured byte count exactly as the fractional budget would.
"""

from __future__ import annotations

import re
from fractions import Fraction

_UNITS = {
    "": 1, "B": 1,
    "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4,
    "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4,
    "kB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4,
}
_SIZE = re.compile(r"^(?P<num>[0-9]+(?:\.[0-9]+)?|\.[0-9]+) ?(?P<unit>[A-Za-z]*)$")
_UNIT_LIST = "B, K, M, G, T, KiB, MiB, GiB, TiB, kB, MB, GB, TB"


class SizeError(ValueError):
    """A size or tolerance that does not parse; the message names it."""


def parse_size(value: object) -> int:
    """Returns the size in bytes; raises SizeError naming the bad value."""
    if isinstance(value, bool):
        raise SizeError(f"{value!r} is not a size (use bytes as an int, or a string like '2GiB')")
    if isinstance(value, int):
        if value < 0:
            raise SizeError(f"{value!r} is negative; a size must be >= 0")
        return value
    if not isinstance(value, str):
        raise SizeError(
            f"{value!r} is not a size: give an int (bytes) or a string like '1.5 GiB', not {type(value).__name__}"
        )
    text = value.strip()
    if text.startswith("-"):
        raise SizeError(f"{value!r} is negative; a size must be >= 0")
    m = _SIZE.match(text)
    if m is None:
        raise SizeError(f"{value!r} is not a size (expected a number, at most one space, and a unit: {_UNIT_LIST})")
    unit = m.group("unit")
    if unit not in _UNITS:
        raise SizeError(f"{value!r} has an unknown unit {unit!r} (known: {_UNIT_LIST})")
    return int(Fraction(m.group("num")) * _UNITS[unit])


_IEC = (("TiB", 1024**4, 2), ("GiB", 1024**3, 2), ("MiB", 1024**2, 1), ("KiB", 1024, 1))


def format_size(n: int | None) -> str:
    """IEC units, as the failures and reports print them: ``2.31 GiB``,
    ``316.0 MiB``, ``512 B``; ``n/a`` for None."""
    if n is None:
        return "n/a"
    sign = "-" if n < 0 else ""
    a = abs(n)
    for unit, scale, digits in _IEC:
        if a >= scale:
            return f"{sign}{a / scale:.{digits}f} {unit}"
    return f"{sign}{a} B"


class Tolerance:
    """Allowed growth over a baseline: a percentage, a size, or both (the
    larger of the two applies)."""

    __slots__ = ("fraction", "absolute", "text")

    def __init__(self, fraction: Fraction, absolute: int, text: str):
        self.fraction = fraction
        self.absolute = absolute
        self.text = text

    def allowed(self, baseline: int) -> int:
        return max(int(baseline * self.fraction), self.absolute)

    def __repr__(self) -> str:
        return f"Tolerance({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tolerance) and (self.fraction, self.absolute) == (other.fraction, other.absolute)


def parse_tolerance(value: object) -> Tolerance:
    """``5%``, ``16MiB`` or ``5%,1MiB``; raises SizeError naming the value."""
    if not isinstance(value, str) or not value.strip():
        raise SizeError(f"{value!r} is not a tolerance (expected e.g. '5%', '16MiB' or '5%,1MiB')")
    fraction, absolute = None, None
    for part in (p.strip() for p in value.split(",")):
        if part.endswith("%"):
            if fraction is not None:
                raise SizeError(f"tolerance {value!r} gives two percentages")
            try:
                pct = Fraction(part[:-1].strip())
            except (ValueError, ZeroDivisionError):
                raise SizeError(f"tolerance {value!r}: {part!r} is not a percentage") from None
            if pct < 0:
                raise SizeError(f"tolerance {value!r} is negative")
            fraction = pct / 100
        else:
            if absolute is not None:
                raise SizeError(f"tolerance {value!r} gives two sizes")
            try:
                absolute = parse_size(part)
            except SizeError as exc:
                raise SizeError(f"tolerance {value!r}: {exc}") from None
    return Tolerance(fraction or Fraction(0), absolute or 0, value.strip())


def plural(n: int, one: str, many: str | None = None) -> str:
    """"1 test", "2 tests" (many: the irregular plural)."""
    return f"{n} {one if n == 1 else (many or one + 's')}"
