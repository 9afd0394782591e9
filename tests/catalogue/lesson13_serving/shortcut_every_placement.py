"""Shortcut: try every placement where data flows up. Right on small workflows; on 20 to 30
operators there are billions, and the check's 10 s of CPU run out."""
# expect: placement = 0

from __future__ import annotations

import itertools


def cheapest_tiers(compute, inputs, sent, links):
    read = {u for found in inputs for u in found}
    best = None
    for tiers in itertools.product(range(len(links) + 1), repeat=len(compute)):
        if any(tiers[u] > tiers[o] for o, found in enumerate(inputs) for u in found):
            continue
        cost = sum(compute[o][t] for o, t in enumerate(tiers))
        cost += sum(sent[u] * sum(links[tiers[u]:tiers[o]]) for o, found in enumerate(inputs) for u in found)
        cost += sum(sent[o] * sum(links[tiers[o]:]) for o in range(len(tiers)) if o not in read)
        if best is None or cost < best[0]:
            best = (cost, list(tiers))
    return best[1]
