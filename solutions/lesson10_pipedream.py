"""Lesson 10 exercise: PipeDream's weight versions, read from an asynchronous pipeline's rows."""

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
    # BEGIN SOLUTION
    # HINT: walk a stage's row as the stage lives it: what has it applied when each forward starts?
    applied = []
    for row in rows:
        updates, before = 0, {}
        for action in row:
            kind, microbatch = action[0], int(action[1:])
            if kind == "F":
                before[microbatch] = updates
            elif (microbatch + 1) % every == 0:
                updates += 1
        applied.append(before)
    plan = []
    for own in applied:
        chosen = {"stashing": own, "vertical_sync": applied[0],
                  "2bw": {i: max(0, i // every - 1) for i in own}}[policy]
        plan.append([chosen[i] for i in range(len(own))])
    return plan
    # END SOLUTION


def versions_held(rows: list[list[str]], policy: str, every: int = 1) -> list[int]:
    """The most weight versions each stage holds at once, checked after each of its computations.

    After a computation, a stage holds its newest version, the version of every micro-batch in
    flight on it (forward done, backward not yet), and every version from the one its next forward
    will run on (version_plan's) up to its newest, which that forward may still need.
    """
    # BEGIN SOLUTION
    # HINT: the lesson's timeline: under each device, what must it keep after each box?
    plan = version_plan(rows, policy, every)
    most = []
    for stage, row in enumerate(rows):
        forwards = [int(action[1:]) for action in row if action[0] == "F"]
        latest, inflight, done, peak = 0, {}, 0, 0
        for action in row:
            kind, microbatch = action[0], int(action[1:])
            if kind == "F":
                inflight[microbatch] = plan[stage][microbatch]
                done += 1
            else:
                inflight.pop(microbatch)
                latest += (microbatch + 1) % every == 0
            upcoming = plan[stage][forwards[done]] if done < len(forwards) else latest
            peak = max(peak, len({latest, *inflight.values(), *range(upcoming, latest + 1)}))
        most.append(peak)
    return most
    # END SOLUTION
