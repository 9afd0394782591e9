"""Energy: GPU frequency models and Perseus's iteration time-energy frontier of a pipeline."""

from edulib.energy.frontier import Point, exhaustive_frontier, frontier, pipeline_dag
from edulib.energy.gpu import A100, GPU, cubic

__all__ = ["A100", "GPU", "Point", "cubic", "exhaustive_frontier", "frontier", "pipeline_dag"]
