"""The checks of every exercise, one module per lesson: seeded cases, some hidden, and a judge that
runs in the grader (`base` holds what they are made of). Importing the package enters each
lesson's checks, in the lessons' order, into `CHECKS` and the names a submission may not call into
`FORBIDDEN`.
"""

from edulib.grading.checks import (  # noqa: F401 (each module enters its checks)
    lesson01_data_parallelism,
    lesson02_allreduce,
    lesson03_tensor_parallelism,
    lesson04_pipeline,
    lesson05_sharding,
    lesson06_context,
    lesson07_experts,
    lesson08_hybrid,
    lesson09_alpa,
    lesson10_compression,
    lesson11_pipedream,
    lesson14_measurement,
)
from edulib.grading.checks.base import CHECKS, FORBIDDEN, Case, Check, Unanswered, Wrong, answer_of

__all__ = ["CHECKS", "FORBIDDEN", "Case", "Check", "Unanswered", "Wrong", "answer_of"]
