"""Shortcut: each rank's mean of its own values, no communication at all."""
# expect: global mean = 0

from __future__ import annotations


def global_mean(values):
    return values.mean()
