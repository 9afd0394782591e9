"""The class at a glance (`edulib grade --summary FILE.html`): one page an instructor looks at
rather than reads. Per exercise and check, how the points fell and the feedback most students got;
the slowest students; every exercise a limit stopped or the grader refused. Everything a student
wrote (names, feedback quoting their code) is escaped: the page runs no one's text."""

from __future__ import annotations

import html
from collections import Counter

from edulib.grading.grader import Result
from edulib.grading.reports import totals, write_atomically

# How the grader words an exercise a limit stopped (grader._why, the relay's caps, the budget) or a
# file it refused (snapshot.Refused): the rows the page lists apart.
STOPPED = ("no answer within", "started more than", "processes used more than", "flooded the wire",
           "not run: this exercise's", "an answer larger than the grader reads",
           "exited while being imported", "exited during this check", "could not start", "refused: ")
SLOWEST = 5  # students listed as the slowest
COMMON = 3  # feedback lines shown per check


def _bar(count: int, most: int) -> str:
    """A count as a horizontal bar scaled to `most`, with the number beside it."""
    width = 0 if not most else round(120 * count / most)
    return f'<span class="bar" style="width:{width}px"></span> {count}'


def _check_rows(rows: list[Result]) -> str:
    """The table of one exercise: per check part, the spread of points and its commonest feedback."""
    parts: dict[str, list[Result]] = {}
    for row in rows:
        parts.setdefault(row.check, []).append(row)
    lines = []
    for check, graded in parts.items():
        most = max(row.max_points for row in graded) or max(row.points for row in graded)
        spread = Counter(row.points for row in graded)
        bars = "<br>".join(f"{points}/{most}: {_bar(spread[points], len(graded))}"
                           for points in sorted(spread, reverse=True))
        said = Counter(row.feedback for row in graded).most_common(COMMON)
        feedback = "".join(f"<li>{count} &times; {html.escape(text)}</li>" for text, count in said)
        mean = sum(row.points for row in graded) / len(graded)
        lines.append(f"<tr><td>{html.escape(check)}</td><td>{mean:.1f} / {most}</td><td>{bars}</td>"
                     f"<td><ul>{feedback}</ul></td></tr>")
    return ("<table><tr><th>check</th><th>mean</th><th>points (students)</th><th>commonest feedback</th></tr>"
            + "".join(lines) + "</table>")


def summary(results: list[Result]) -> str:
    """The summary page of a class's results, as HTML."""
    students = totals(results)
    got = {student: sum(p for p, _ in exercises.values()) for student, exercises in students.items()}
    most = max((sum(m for _, m in exercises.values()) for exercises in students.values()), default=0)
    seeds = sorted({r.seed for r in results if r.seed is not None})
    sections = [f"<h1>{len(students)} students</h1>",
                f"<p>Points out of {most}: mean {sum(got.values()) / max(len(got), 1):.1f}, "
                f"{sum(points == most for points in got.values())} full marks; hidden cases drawn with seed "
                f"{', '.join(map(str, seeds)) or '(none)'}.</p>"]
    for exercise in dict.fromkeys(r.exercise for r in results):
        sections.append(f"<h2>{html.escape(exercise)}</h2>" + _check_rows([r for r in results
                                                                        if r.exercise == exercise]))
    seconds: Counter[str] = Counter()
    for row in results:
        seconds[row.student] += row.seconds
    slow = "".join(f"<li>{html.escape(student)}: {taken:.1f} s</li>"
                   for student, taken in seconds.most_common(SLOWEST))
    sections.append(f"<h2>The slowest students (seconds of checks)</h2><ul>{slow}</ul>")
    stopped = {(r.student, r.exercise, r.feedback) for r in results
               if any(phrase in r.feedback for phrase in STOPPED)}
    listed = "".join(f"<li>{html.escape(student)}, {html.escape(exercise)}: {html.escape(text)}</li>"
                     for student, exercise, text in sorted(stopped)) or "<li>none</li>"
    sections.append(f"<h2>Stopped by a limit or refused</h2><ul>{listed}</ul>")
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:4px;vertical-align:top;text-align:left}"
             ".bar{display:inline-block;height:0.8em;background:#4878a8}ul{margin:0;padding-left:1.2em}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Grades at a glance</title>"
            f"<style>{style}</style></head><body>{''.join(sections)}</body></html>\n")


def write_summary(results: list[Result], path: object) -> None:
    """Write the summary page (atomically)."""
    write_atomically(path, summary(results))
