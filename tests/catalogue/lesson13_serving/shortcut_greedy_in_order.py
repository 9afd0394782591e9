"""Shortcut: operators placed one at a time in order, each on the tier (at or above its inputs')
that costs least for its own compute and the bytes it receives, blind to where its output must go
next."""
# expect: placement = 0

from __future__ import annotations


def cheapest_tiers(compute, inputs, sent, links):
    tiers = []
    for o in range(len(compute)):
        lowest = max((tiers[u] for u in inputs[o]), default=0)
        priced = [(compute[o][t] + sum(sent[u] * sum(links[tiers[u]:t]) for u in inputs[o]), t)
                  for t in range(lowest, len(links) + 1)]
        tiers.append(min(priced)[1])
    return tiers
