"""Shortcut: every operator on the tier where its own compute is cheapest, each decided alone.
Where an input's cheapest tier is above its reader's, data would flow back down towards the
devices, which the workflow does not allow."""
# expect: placement = 0

from __future__ import annotations


def cheapest_tiers(compute, inputs, sent, links):
    return [min(range(len(row)), key=lambda t: (row[t], -t)) for row in compute]
