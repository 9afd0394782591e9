"""What a run reports beside its losses: the bytes each axis sent, and how far a layout's run is
from one process's."""


from __future__ import annotations

from edulib import comm
from edulib.train.config import TrainConfig

TRAFFIC_AXES = ("dp", "pp", "tp", "cp", "ep")


def by_axis(transfers: list[comm.Transfer], pipeline: set[int], context: set[int]) -> dict[str, int]:
    """Bytes a rank sent, by the axis that sent them: messages to the pipeline's ranks and a tied
    pair's sum (pp), the ring's steps and collectives (cp), the experts' all-to-alls (ep), the
    gradients' and ZeRO's weights' collectives (dp), and the tensor-parallel layers' (tp)."""
    sent = dict.fromkeys(TRAFFIC_AXES, 0)
    for transfer in transfers:
        if transfer.direction in ("loss", "norm"):  # (a step's loss, the gradients' norm)
            continue
        if transfer.operation == "send":
            axis = "pp" if set(transfer.ranks) <= pipeline else "cp"
        elif transfer.direction == "tied":
            axis = "pp"
        elif transfer.operation == "all_to_all":
            axis = "ep"
        elif transfer.direction in ("gradients", "parameters"):
            axis = "dp"
        else:
            axis = "cp" if len(context) > 1 and set(transfer.ranks) == context else "tp"
        sent[axis] += transfer.nbytes
    return sent


AGREE = {"fp32": {"first_loss": 1e-4, "losses": 1e-4, "weights": 1e-5, "gradients": 1e-4},
         "bf16": {"first_loss": 1e-2, "gradients": 5e-2}}
# how close a layout is to one process computing in the same precision: in fp32, rounding alone, on
# every step. In bf16 (8 bits kept, rounded wherever a layout cuts a sum or sends a message) two runs
# part ways over the steps (by 8 % in a loss after 20 steps of SGD at lr 0.3), so what is held is
# the first step: its loss, and its gradients relative to each one's size, which a bug cannot hide
# in (a missing sum over ranks is off by a whole share of the gradient; rounding alone reached
# 1.7e-2 on the covering configs)


def disagreement(got: dict, want: dict) -> dict[str, float]:
    """How far a run (rank 0's report) is from one process's: the relative difference of the first
    step's loss and the largest of any step's, the largest absolute difference of a final weight,
    and the largest difference of a first-step gradient relative to its norm."""
    losses = [abs(a - b) / abs(b) for a, b in zip(got["losses"], want["losses"], strict=True)]
    weights = max(float((got["weights"][name] - w).abs().max()) for name, w in want["weights"].items())
    gradients = max(float((got["gradients"][name] - g).norm() / g.norm().clamp_min(1e-12))
                    for name, g in want["gradients"].items())
    return {"first_loss": losses[0], "losses": max(losses), "weights": weights, "gradients": gradients}


def agrees(config: TrainConfig, found: dict[str, float]) -> bool:
    """Whether a disagreement is within what the config's precision allows (a NaN does not)."""
    return all(found[key] <= bound for key, bound in AGREE[config.precision].items())
