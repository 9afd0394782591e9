"""Slip: 1F1B's warm-up of p - 1 - device forwards, without cutting it short when there are fewer
micro-batches than that: with m < p, a device runs forwards of micro-batches that do not exist.
Right whenever m >= p; the visible p=4, m=2 shows it."""
# expect: 1F1B schedule = 0


def one_f_one_b(p: int, m: int) -> list[str]:
    rows = []
    for device in range(p):
        warm = p - device - 1
        actions = [f"F{mb}" for mb in range(warm)]
        for step in range(m - warm):
            actions += [f"F{warm + step}", f"B{step}"]
        actions += [f"B{mb}" for mb in range(max(m - warm, 0), m)]
        rows.append(" ".join(actions))
    return rows
