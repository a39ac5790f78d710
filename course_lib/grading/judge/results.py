"""What a check found: each sub-check's result (:class:`SubResult`), the item's
(:class:`ItemResult`: plain data to store and send, :meth:`ItemResult.as_data`), the points a
notebook's ``check`` returns (:class:`Score`, the bare number nbgrader reads), and the
report the student reads (:func:`format_report`)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["SubResult", "ItemResult", "Score", "format_report", "MAX_MESSAGE"]

MAX_MESSAGE = 10_000  # characters of one sub-check's message kept (its text can quote what the answer holds)


@dataclass
class SubResult:
    title: str
    points: float
    earned: float
    hidden: bool
    message: str = ""
    mistake: str = ""  # the likely cause, by name (a catalogued mistake's name when it is one)

    def __post_init__(self) -> None:
        # a message quotes the answer (its names, its values): an answer can make it any size
        if len(self.message) > MAX_MESSAGE:  # (cut to MAX_MESSAGE with its note: read back, it is not cut again)
            note = f"\n... (cut: the message was {len(self.message):,} characters)"
            self.message = self.message[:MAX_MESSAGE - len(note)] + note

    @property
    def passed(self) -> bool:
        """Earned its points; a sub-check worth no points (advice) passes only without a
        message (a failing or skipped sub-check always has one)."""
        return self.earned >= self.points and (self.points > 0 or not self.message)


@dataclass
class ItemResult:
    item: str
    results: list[SubResult]
    graded: bool  # True when the hidden sub-checks ran too
    total_points: float
    reference_used: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def earned(self) -> float:
        if self.reference_used:
            return 0.0
        return float(sum(r.earned for r in self.results))

    @property
    def score(self) -> float:
        """Points for nbgrader: the real score when graded; when only the visible
        sub-checks ran, their pass fraction scaled to the item's points."""
        if self.graded or self.reference_used:
            return self.earned
        ran = sum(r.points for r in self.results)
        return self.total_points * (self.earned / ran) if ran else 0.0

    def as_data(self) -> dict:
        return {"item": self.item, "graded": self.graded, "total_points": self.total_points,
                "reference_used": self.reference_used, "notes": list(self.notes),
                "results": [r.__dict__.copy() for r in self.results]}

    @classmethod
    def from_data(cls, data: dict) -> "ItemResult":
        return cls(data["item"], [SubResult(**r) for r in data["results"]], data["graded"],
                   data["total_points"], data.get("reference_used", ""), list(data.get("notes", [])))


class Score(float):
    """The points a check earned. Its ``repr`` is the bare number nbgrader reads."""

    result: ItemResult

    def __new__(cls, value: float, result: ItemResult) -> "Score":
        obj = super().__new__(cls, round(value, 4))
        obj.result = result
        return obj

    def __repr__(self) -> str:
        return float.__repr__(self)

    def _repr_markdown_(self) -> str:
        """What JupyterLab shows below a test cell (nbgrader reads the plain number): the points
        when every check ran; otherwise what the visible checks are worth and earned, and how
        many points the hidden checks decide once the notebook is handed in."""
        result = self.result
        if result.graded or result.reference_used:
            return f"**{float(self):g} / {result.total_points:g} points**"
        ran = sum(r.points for r in result.results)
        earned = sum(r.earned for r in result.results)
        shown = f"**visible checks: {earned:g} / {ran:g} points**"
        if result.total_points > ran:
            shown += f" · {result.total_points - ran:g} more points from hidden checks after you hand in"
        return shown


def format_report(result: ItemResult) -> str:
    """Plain-text report: one line when everything passes, details otherwise."""
    name = result.item
    if result.reference_used:
        advice = "" if "yourself" in result.reference_used else " Write the computation yourself; torch operations are fine."
        return f"✗ {name}: 0/{result.total_points:g} points. Your solution earns nothing because {result.reference_used}.{advice}"
    n_pass = sum(r.passed for r in result.results)
    n = len(result.results)
    graded = [r for r in result.results if r.points > 0]  # the others are advice
    lines: list[str] = []
    if result.graded:
        head = f"{name}: {result.earned:g}/{result.total_points:g} points"
        g_pass = sum(r.passed for r in graded)
        if n_pass == n:
            lines.append(f"✓ {head} — " + ("the check passes." if n == 1 else f"all {n} checks pass."))
        elif g_pass == len(graded):
            lines.append(f"✓ {head} — all {len(graded)} graded checks pass; advice below.")
        else:
            not_run = sum(1 for r in graded if not r.passed and r.message == "not run")
            lines.append(f"✗ {head} — {len(graded) - g_pass - not_run} of {len(graded)} graded checks failed"
                         + (f" ({not_run} not run)." if not_run else "."))
    else:
        if n_pass == n:
            which = "the visible check passes" if n == 1 else f"the {n} visible checks pass"
            lines.append(f"✓ {name}: {which}. The grader runs more checks on other inputs.")
        elif all(r.passed for r in graded):
            lines.append(f"✓ {name}: the graded visible checks pass; advice below. The grader runs more checks "
                         "on other inputs.")
        else:
            not_run = sum(1 for r in result.results if not r.passed and r.message == "not run")
            lines.append(f"✗ {name}: {n - n_pass - not_run} of {n} visible checks failed"
                         + (f" ({not_run} not run)." if not_run else "."))
    if n_pass != n:
        for r in result.results:
            mark = "✓" if r.passed else "✗"
            pts = f" [{r.earned:g}/{r.points:g}]" if result.graded else ""
            lines.append(f"  {mark} {r.title}{pts}")
            if r.message == "not run":
                lines[-1] += " (not run)"
            elif not r.passed and r.message:
                lines.extend("      " + line for line in r.message.splitlines())
    lines.extend("  note: " + note for note in result.notes)
    return "\n".join(lines)
