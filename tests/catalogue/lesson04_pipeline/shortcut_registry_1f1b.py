"""Shortcut (red team 5): the 1F1B rows taken from edulib's registry of pipeline schedules,
`edulib.pp.SCHEDULE_KINDS["1f1b"].build`, which the forbidden names did not reach."""
# expect: 1F1B schedule = 0

from edulib.pp import SCHEDULE_KINDS


def one_f_one_b(p: int, m: int) -> list[str]:
    return [" ".join(action.short(1) for action in row) for row in SCHEDULE_KINDS["1f1b"].build(p, m).actions]
