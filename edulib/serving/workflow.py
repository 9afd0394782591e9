"""A workflow as a DAG of operators, each with its model choices, and the tiers it may run on.

Data flows one way, from the devices that hold it towards the cloud: an operator runs on the tier
of its inputs or a later one. A source (a camera) makes its data on the first tier; the answers
go to the last. A plan picks a model for each operator and a tier for each: it costs each model's
compute at its tier's price, and each byte sent at the prices of the links it crosses; its
accuracy is the product of the chosen models' (their errors taken as independent).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edulib.base.arguments import check_count


@dataclass(frozen=True)
class ModelChoice:
    """One model an operator may run: its accuracy, its compute per request (work units) and the
    bytes it outputs per request."""

    name: str
    accuracy: float
    compute: float
    output_bytes: float


@dataclass(frozen=True)
class WorkflowOperator:
    """A step of the workflow: the operators it reads (by name) and its model choices; a source
    has no inputs and one choice, its data."""

    name: str
    inputs: tuple[str, ...]
    choices: tuple[ModelChoice, ...]

    @property
    def source(self) -> bool:
        """Whether it makes the workflow's data (on the first tier)."""
        return not self.inputs


@dataclass(frozen=True)
class Workflow:
    """Operators in an order where every input comes before its reader."""

    operators: tuple[WorkflowOperator, ...]

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for op in self.operators:
            missing = [name for name in op.inputs if name not in seen]
            if missing or not op.choices:
                raise ValueError(
                    f"operator {op.name!r} reads {missing}, which come later or nowhere; list every "
                    "operator after its inputs"
                    if missing
                    else f"operator {op.name!r} has no model to choose"
                )
            seen.add(op.name)

    @property
    def sinks(self) -> list[WorkflowOperator]:
        """The operators no other reads: their outputs are the answers."""
        read = {name for op in self.operators for name in op.inputs}
        return [op for op in self.operators if op.name not in read]


@dataclass(frozen=True)
class Tier:
    """A kind of place to compute: its price per work unit (None: it cannot compute)."""

    name: str
    price: float | None


@dataclass(frozen=True)
class Infrastructure:
    """Tiers from the data's devices to the cloud, and the price per byte of each link between one
    tier and the next."""

    tiers: tuple[Tier, ...]
    links: tuple[float, ...] = field(default=())

    def __post_init__(self) -> None:
        check_count(len(self.tiers), "tiers")
        if len(self.links) != len(self.tiers) - 1:
            raise ValueError(
                f"{len(self.tiers)} tiers need {len(self.tiers) - 1} link prices; got {len(self.links)}"
            )

    def moving(self, start: int, end: int) -> float:
        """The price of one byte sent from tier `start` up to tier `end` (0 on the same tier)."""
        return sum(self.links[start:end])


def vehicle_tracking(network_price: float = 1.0) -> tuple[Workflow, Infrastructure]:
    """The lecture's example: track vehicles across two cameras. Each camera's images (2 MB) go to
    an object detector, and a re-identification model matches the two cameras' detections.
    Cameras compute dearly, the edge site at twice the cloud's price; a megabyte costs 0.1 from a
    camera to the edge and `network_price` from the edge to the cloud."""
    mb = 1e6
    detectors = (
        ModelChoice("small detector", 0.90, 1.0, 0.02 * mb),
        ModelChoice("large detector", 0.97, 4.0, 0.02 * mb),
    )
    reid = (ModelChoice("small re-id", 0.92, 1.0, 0.001 * mb),
            ModelChoice("large re-id", 0.98, 3.0, 0.001 * mb))
    camera = (ModelChoice("images", 1.0, 0.0, 2 * mb),)
    workflow = Workflow(
        (
            WorkflowOperator("camera 1", (), camera),
            WorkflowOperator("camera 2", (), camera),
            WorkflowOperator("detect 1", ("camera 1",), detectors),
            WorkflowOperator("detect 2", ("camera 2",), detectors),
            WorkflowOperator("re-identify", ("detect 1", "detect 2"), reid),
        )
    )
    tiers = (Tier("cameras", 20.0), Tier("edge", 2.0), Tier("cloud", 1.0))
    return workflow, Infrastructure(tiers, (0.1 / mb, network_price / mb))
