"""Energy: GPU frequency models and Perseus's iteration time-energy frontier of a pipeline."""

from edulib.energy.frontier import (
    Frontier,
    Point,
    exhaustive_frontier,
    frontier,
    gpt3_stage_times,
    pipeline_dag,
    pipeline_frontier,
)
from edulib.energy.gpu import A100, GPU, cubic

__all__ = ["A100", "GPU", "Frontier", "Point", "cubic", "exhaustive_frontier", "frontier", "gpt3_stage_times",
           "pipeline_dag", "pipeline_frontier"]
