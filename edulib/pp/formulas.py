"""The papers' closed forms for a schedule's bubble and memory, to set beside the simulator.

Costs are per device for its whole share of the model, as `simulate` takes them: t_f a forward,
t_b a backward (only the input gradient where the schedule has W) and t_w a weight gradient.
The papers write them per stage: F, B (a full backward, input and weights), W, and DualPipe's F&B,
a forward and a backward overlapped (here F + B: the pair hides communication, not compute).
Memory is counted in micro-batches of one device's layers: a device of the V schedules holds
two stages, each half its layers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ClosedForm:
    """A schedule's bubble (idle time of the busiest device in one step) and peak memory, each
    with its formula; `relation` says how the simulator's bubble compares: "=", "<=" or ">="."""

    bubble: float
    bubble_formula: str
    relation: str
    held: float
    held_formula: str
    source: str


def closed_form(name: str, p: int, m: int, chunks: int = 1, t_f: float = 1.0, t_b: float = 2.0,
                t_w: float = 0.0) -> ClosedForm | None:
    """The paper's bubble and memory for schedule `name` on p devices and m micro-batches, or None
    where no paper gives one (the naive pipeline), or where its conditions do not hold: 1F1B-like
    schedules need m >= p, ZB-H1 and DualPipeV a weight gradient no slower than B (and DualPipeV a
    forward no slower than a whole backward), ZB-V m >= 2p - 1."""
    full = t_b + t_w  # a whole backward, per device
    if name in ("gpipe", "1f1b") or (name == "interleaved_1f1b" and chunks == 1):
        if m < p:
            return None
        held, formula = (m, "m") if name == "gpipe" else (p, "p")
        return ClosedForm((p - 1) * (t_f + full), "(p-1)(F+B)", "=", held, formula,
                          "GPipe (Huang et al., 2019); 1F1B (Narayanan et al., 2019)")
    if name == "interleaved_1f1b":
        if m % p:
            return None
        return ClosedForm((p - 1) * (t_f + full) / chunks, "(p-1)(F+B)/v", "=",
                          min(p * (1 + (p - 1) / (p * chunks)), m), "p(1 + (p-1)/(pv)), or m if fewer",
                          "Megatron-LM's interleaved schedule (Narayanan et al., 2021)")
    if name == "zero_bubble":
        if m < p or t_w > t_b:
            return None
        return ClosedForm((p - 1) * (t_f + full - 2 * t_w), "(p-1)(F+B-2W)", "=", p, "p",
                          "ZB-H1 (Qi et al., 2024)")
    f, b, w = t_f / 2, full / 2, t_w / 2  # per stage: each device holds two
    if name == "zb_v":
        if m < 2 * p - 1:
            return None
        return ClosedForm((p - 1) * f, "(p-1)F, the fill", "=" if t_f == t_b == t_w else ">=", p,
                          "p (2p half-size stages)", "ZB-V (Qi et al., 2024)")
    if name == "dualpipe_v":
        if t_w > t_b or t_f > full:
            return None
        return ClosedForm((p - 1) * ((f + b) + b - 3 * w), "(PP/2-1)(F&B+B-3W), PP = 2p stages",
                          "=" if t_f == t_b == t_w else "<=", p + 0.5, "p + 1/2 (PP+1 half-size stages)",
                          "DualPipeV (DeepSeek-AI, 2024)")
    return None
