"""Lesson 10 exercise: PipeDream's weight versions, read from an asynchronous pipeline's rows.

Graded on (the lesson's score cell and `edulib grade` run the same checks):
- version plan, 2 + 2 points: every stage's version for every micro-batch, as the simulator reads
  the same rows. Visible cases: stashing on 5 stages, 10 micro-batches, an update every 1;
  vertical_sync on 3 stages, 7 micro-batches, an update every 1; 2bw on 3 stages, 9 micro-batches,
  an update every 3. Hidden cases: other stage and micro-batch counts, fewer micro-batches than
  stages, several per update.
- versions held, 2 + 2 points: the most versions each stage holds, as the simulator walks the same
  rows. Visible cases: stashing on 5 stages, 10 micro-batches, an update every 1; vertical_sync on 3
  stages, 7 micro-batches, an update every 1; 2bw on 3 stages, 9 micro-batches, an update every 3.
  Hidden cases: other stage and micro-batch counts, fewer micro-batches than stages, several per
  update.
"""

from __future__ import annotations


def version_plan(rows: list[list[str]], policy: str, every: int = 1) -> list[list[int]]:
    """The weight version each micro-batch's forward (and so its backward) runs on, per stage:
    plan[s][i] for stage s and micro-batch i.

    rows[s] is stage s's computations in order: "F3" is micro-batch 3's forward, "B3" its backward.
    Micro-batches come in batches of `every` consecutive ones; a stage updates its weights after
    the backward of the last micro-batch of each batch. A version is the number of updates a stage
    has applied. The policies are the lesson's: "stashing" (the stage's newest version when the
    forward runs), "vertical_sync" (the version stage 0 used for that micro-batch) and "2bw" (every
    micro-batch of batch t runs on version t - 1, never below 0; every is at least the number of
    stages).
    """
    raise NotImplementedError("walk a stage's row as the stage lives it: what has it applied when each forward starts?")


def versions_held(rows: list[list[str]], policy: str, every: int = 1) -> list[int]:
    """The most weight versions each stage holds at once, checked after each of its computations.

    After a computation, a stage holds its newest version, the version of every micro-batch in
    flight on it (forward done, backward not yet), and every version from the one its next forward
    will run on (version_plan's) up to its newest, which that forward may still need.
    """
    raise NotImplementedError("the lesson's timeline: under each device, what must it keep after each box?")
