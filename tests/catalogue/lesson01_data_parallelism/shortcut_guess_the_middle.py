"""Shortcut: no measurement at all: the middle of the ranges the contract gives (alpha 40 ms, 1 / beta
2 MB/s), returned for every link."""
# expect: measure the link = 0


def measure_link() -> tuple[float, float]:
    return 40e-3, 1 / 2e6
