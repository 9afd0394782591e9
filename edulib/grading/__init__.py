"""The autograder behind exercises/: checks with points, run in contained process trees, judged
in the grader's own process, reported for a grade book."""

from edulib.grading.checks import CHECKS, Case, Check, Wrong
from edulib.grading.generate import generate, make_exercise
from edulib.grading.grader import Limits, Result, find_submissions, grade
from edulib.grading.reports import report, score, write_csv, write_gradescope, write_json

__all__ = ["CHECKS", "Case", "Check", "Limits", "Result", "Wrong", "find_submissions", "generate", "grade",
           "make_exercise", "report", "score", "write_csv", "write_gradescope", "write_json"]
