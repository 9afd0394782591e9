"""The autograder behind exercises/: checks with points, run safely, reported for a grade book."""

from edulib.grading.checks import CHECKS, Check, Wrong
from edulib.grading.generate import generate, make_exercise
from edulib.grading.grader import Result, grade, report, score

__all__ = ["CHECKS", "Check", "Result", "Wrong", "generate", "grade", "make_exercise", "report",
           "score"]
