"""Plain-text tables: what the tour, the benchmarks and the notebooks print."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def format_bytes(nbytes: float) -> str:
    """1 KiB, 4 MiB, 1.5 GiB, ...: a byte count in words, three significant digits."""
    units = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
    unit, scale = next(((unit, scale) for unit, scale in units if nbytes >= scale), ("B", 1))
    value = nbytes / scale
    return f"{value:.3g} {unit}" if value < 999.5 else f"{value:.0f} {unit}"  # never "1e+03"


def format_rate(value: float, unit: str) -> str:
    """725 TFLOP/s, 3.2 GFLOP/s, 12 kFLOP/s: a rate with the SI prefix that keeps it readable."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{_digits(value / scale)} {prefix}{unit}"
    return f"{_digits(value)} {unit}"


def _digits(value: float) -> str:
    """Three significant digits, never in e-notation."""
    return f"{value:.3g}" if abs(value) < 999.5 else f"{value:.0f}"


def format_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Lay rows out under their headers in aligned columns, numbers right-aligned."""
    cells = [[str(cell) for cell in row] for row in rows]
    numeric = [all(_is_number(row[column]) for row in cells) and bool(cells)
               for column in range(len(headers))]
    widths = [max(len(str(headers[column])), *(len(row[column]) for row in cells))
              for column in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(cell.rjust(width) if right else cell.ljust(width)
                         for cell, width, right in zip(row, widths, numeric, strict=True)).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([line([str(header) for header in headers]), rule, *map(line, cells)])


def _is_number(text: str) -> bool:
    """Whether a cell reads as a number (so it aligns right)."""
    try:
        float(text.replace(",", "").rstrip("x%"))
    except ValueError:
        return False
    return True
