"""``workbook export --format canvas|moodle|blackboard``: each LMS's own grade-import file.

A released notebook 03 with four students recorded in its gradebook through nbgrader's
API (one on time with every point, one late with nbgrader's penalty, one hostile whose
names are spreadsheet formulas, one not in the LMS), and for each LMS its own export as
the roster, written the way that LMS writes it. The headers and rows are compared with
each importer's documented format:

- Canvas (Grades → Import): ``Student, ID, SIS User ID, SIS Login ID, Section``, then one
  column per assignment, ``Title (id)`` as Canvas's export names it, an optional ``Points
  Possible`` row; students found by the numeric ``ID`` (nbgrader's ``lms_user_id``); any
  other column would become a new assignment.
- Moodle (Grades → Import → CSV): an identifier column mapped to a user field; one unknown
  user or a grade above the maximum grade point (100) aborts the whole import.
- Blackboard (Work Offline → Upload): ``Username`` identifies the student, ``|id`` at the end
  of a header the column; in a comma-delimited file every field is quoted.
"""

from __future__ import annotations

import csv
import io
import warnings

import pytest

from autograder.cli import main
from autograder.course import Course, CourseError
from autograder.platforms.lms import lms_export
from autograder.platforms.lms_roster import read_roster, roster_ids
from workbook_class import make_course

NOTEBOOK = "03_self_attention"
AUTOMATIC = {"test_scaled_dot_product_attention": 5, "test_causal_mask": 2, "test_padding_mask": 2,
             "test_SelfAttention": 4}
WRITTEN = {"q_sqrt_dk": 2, "q_permutation": 2, "q_cost": 2}
HOSTILE_FIRST, HOSTILE_LAST = "=HYPERLINK(\"http://evil.example\",\"x\")", "@SUM(A1:A9)"

# (id, first, last, email, lms_user_id, auto points lost, written points, late penalty)
STUDENTS = [
    ("alice", "Alice", "Liddell", "alice@uni.example", "101", 0, 6, 0.0),
    ("bob", "Bob", "Builder", "bob@uni.example", "", 4, 3, 2.0),
    ("mallory", HOSTILE_FIRST, HOSTILE_LAST, "mallory@uni.example", "", 13, 0, 0.0),
    ("zed", "Zed", "Nobody", "zed@elsewhere.example", "", 0, 0, 0.0),  # not in any LMS roster
]
EXPECTED = {"alice": 19.0, "bob": 19 - 4 + 3 - 6 - 2.0, "mallory": 0.0}  # after the late penalty


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    base = tmp_path_factory.mktemp("lms")
    root, assignment = make_course(base / "course", NOTEBOOK)
    assert main(["--course", str(root), "release", assignment]) == 0
    course = Course(root)
    with course.gradebook() as gb, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nbgrader's add_submission warns about its own session use
        for sid, first, last, email, lms_id, lost, written, penalty in STUDENTS:
            gb.update_or_create_student(sid, first_name=first, last_name=last, email=email,
                                        lms_user_id=lms_id or None)
            gb.add_submission(assignment, sid)
            left = lost
            for name, points in AUTOMATIC.items():
                g = gb.find_grade(name, NOTEBOOK, assignment, sid)
                g.auto_score = max(points - left, 0)
                left = max(left - points, 0)
                g.needs_manual_grade = False
            for i, name in enumerate(WRITTEN):
                g = gb.find_grade(name, NOTEBOOK, assignment, sid)
                g.manual_score = min(max(written - 2 * i, 0), 2)
                g.needs_manual_grade = False
            gb.find_submission_notebook(NOTEBOOK, assignment, sid).late_submission_penalty = penalty
            gb.db.commit()
    return course, base


def _csv(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def _write(path, rows) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\r\n").writerows(rows)
    path.write_text(buffer.getvalue(), encoding="utf-8-sig")  # as a download: with a byte-order mark
    return str(path)


CANVAS_EXPORT = [  # Canvas's gradebook export (Grades → Export), as it writes it
    ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "Self-attention (4242)", "Current Score",
     "Unposted Current Score", "Final Score", "Unposted Final Score"],
    ["    Points Possible", "", "", "", "", "19.00", "(read only)", "(read only)", "(read only)", "(read only)"],
    ["Liddell, Alice", "101", "A0001", "alice@uni.example", "Section 1", "", "", "", "", ""],
    ["Builder, Bob", "102", "A0002", "bob@uni.example", "Section 1", "", "", "", "", ""],
    [f"{HOSTILE_LAST}, {HOSTILE_FIRST}", "103", "A0003", "mallory@uni.example", "Section 2", "", "", "", "", ""],
    ["Student, Test", "999", "", "", "Section 1", "", "", "", "", ""],
]


def test_canvas_import_file(course):
    course, base = course
    roster = _write(base / "canvas.csv", CANVAS_EXPORT)
    text, notes = lms_export(course, "canvas", roster, explicit={NOTEBOOK: "Self-attention (4242)"})
    rows = _csv(text)
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "Self-attention (4242)"]
    assert rows[1] == ["Points Possible", "", "", "", "", "19"]
    by_id = {r[1]: r for r in rows[2:]}
    assert by_id["101"] == ["Liddell, Alice", "101", "A0001", "alice@uni.example", "Section 1", "19"]
    assert by_id["102"][-1] == f"{EXPECTED['bob']:g}"  # after the late penalty
    assert by_id["103"][0] == f"'{HOSTILE_LAST}, {HOSTILE_FIRST}" and by_id["103"][-1] == "0"  # no formula
    assert set(by_id) == {"101", "102", "103"}  # zed is not in Canvas; Canvas's test student has no work
    assert any("zed" in n and "not in the LMS's roster" in n for n in notes)
    with course.gradebook() as gb:  # Canvas's user id kept as nbgrader's lms_user_id
        assert gb.find_student("bob").lms_user_id == "102"


def test_canvas_without_a_column_of_its_own_says_it_makes_a_new_assignment(course):
    course, base = course
    text, notes = lms_export(course, "canvas", _write(base / "canvas2.csv", CANVAS_EXPORT[:3]))
    assert _csv(text)[0][5] == NOTEBOOK
    assert any("a new assignment" in n for n in notes)


def test_canvas_scales_to_the_columns_points(course):
    course, base = course
    export = [row[:] for row in CANVAS_EXPORT]
    export[1][5] = "100.00"
    text, notes = lms_export(course, "canvas", _write(base / "canvas3.csv", export),
                             explicit={NOTEBOOK: "Self-attention (4242)"})
    by_id = {r[1]: r for r in _csv(text)[2:]}
    assert by_id["101"][-1] == "100" and by_id["102"][-1] == f"{round(EXPECTED['bob'] * 100 / 19, 2):g}"
    assert any("scaled" in n for n in notes)


MOODLE_EXPORT = [  # Moodle's grade export (Export → Plain text file)
    ["First name", "Last name", "ID number", "Institution", "Department", "Email address",
     "Assignment: Self-attention (Real)", "Course total (Real)", "Last downloaded from this course"],
    ["Alice", "Liddell", "A0001", "", "", "alice@uni.example", "-", "-", "1764000000"],
    ["Bob", "Builder", "A0002", "", "", "bob@uni.example", "-", "-", "1764000000"],
    [HOSTILE_FIRST, HOSTILE_LAST, "A0003", "", "", "mallory@uni.example", "-", "-", "1764000000"],
]


def test_moodle_import_file(course):
    course, base = course
    text, notes = lms_export(course, "moodle", _write(base / "moodle.csv", MOODLE_EXPORT),
                             explicit={NOTEBOOK: "Assignment: Self-attention (Real)"})
    rows = _csv(text)
    assert rows[0] == ["First name", "Last name", "ID number", "Email address", "Assignment: Self-attention (Real)"]
    by_mail = {r[3]: r for r in rows[1:]}
    assert by_mail["alice@uni.example"] == ["Alice", "Liddell", "A0001", "alice@uni.example", "19"]
    assert by_mail["bob@uni.example"][-1] == f"{EXPECTED['bob']:g}"
    assert by_mail["mallory@uni.example"][:2] == [f"'{HOSTILE_FIRST}", f"'{HOSTILE_LAST}"]
    assert set(by_mail) == {"alice@uni.example", "bob@uni.example", "mallory@uni.example"}  # zed would abort
    assert all(r[2] for r in rows[1:])  # no empty identifier (one aborts the import)
    assert any("map from 'Email address'" in n for n in notes)


def test_moodle_refuses_what_would_abort_its_import(course):
    course, base = course
    with pytest.raises(CourseError, match="Moodle aborts"):
        lms_export(course, "moodle")  # no roster: an unknown user would abort
    # a grade above Moodle's maximum grade point (100 unless raised) aborts the whole import: refused
    from autograder.platforms import lms
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lms, "MOODLE_GRADEPOINTMAX", 10.0)
        with pytest.raises(CourseError, match="above 10"):
            lms_export(course, "moodle", _write(base / "moodle2.csv", MOODLE_EXPORT))


BLACKBOARD_EXPORT = [  # Blackboard's Grade Center download (Work Offline → Download, comma)
    ["Last Name", "First Name", "Username", "Student ID", "Last Access", "Availability",
     "Self-attention [Total Pts: 19 Score] |2345678"],
    ["Liddell", "Alice", "alice", "A0001", "2026-11-20 10:00:00", "Available", ""],
    ["Builder", "Bob", "bob", "A0002", "2026-11-20 10:00:00", "Available", ""],
    [HOSTILE_LAST, HOSTILE_FIRST, "mallory", "A0003", "2026-11-20 10:00:00", "Available", ""],
]


def test_blackboard_import_file(course):
    course, base = course
    text, notes = lms_export(course, "blackboard", _write(base / "blackboard.csv", BLACKBOARD_EXPORT),
                             explicit={NOTEBOOK: "Self-attention [Total Pts: 19 Score] |2345678"})
    lines = text.splitlines()
    assert lines[0] == '"Last Name","First Name","Username","Student ID","Self-attention [Total Pts: 19 Score] |2345678"'
    assert '"Liddell","Alice","alice","A0001","19"' in lines
    rows = _csv(text)
    assert all(line.startswith('"') and line.endswith('"') and line.count('"') == 2 * len(row)
               + sum(cell.count('"') * 2 for cell in row) for line, row in zip(lines, rows))  # every field quoted
    by_user = {r[2]: r for r in rows[1:]}
    assert by_user["bob"][-1] == f"{EXPECTED['bob']:g}"
    assert by_user["mallory"][:2] == [f"'{HOSTILE_LAST}", f"'{HOSTILE_FIRST}"]
    assert set(by_user) == {"alice", "bob", "mallory"}


def test_an_lms_export_is_read_as_the_roster(course):
    course, base = course
    assert roster_ids(read_roster(_write(base / "r-canvas.csv", CANVAS_EXPORT))) == {"101", "102", "103", "999"}
    assert roster_ids(read_roster(_write(base / "r-bb.csv", BLACKBOARD_EXPORT))) == {"alice", "bob", "mallory"}
    moodle = read_roster(_write(base / "r-moodle.csv", MOODLE_EXPORT))
    assert moodle.lms == "moodle" and len(moodle.students) == 3
    tabbed = base / "r-bb.xls"  # Blackboard's default download: UTF-16, tab-delimited
    tabbed.write_bytes("\r\n".join("\t".join(r) for r in BLACKBOARD_EXPORT).encode("utf-16"))
    assert roster_ids(read_roster(tabbed)) == {"alice", "bob", "mallory"}


def test_the_export_command(course, capsys):
    course, base = course
    out = base / "grades-canvas.csv"
    roster = _write(base / "cli-canvas.csv", CANVAS_EXPORT)
    assert main(["--course", str(course.root), "export", "--format", "canvas", "--roster", roster,
                 "--column", f"{NOTEBOOK}=Self-attention (4242)", "-o", str(out)]) == 0
    assert _csv(out.read_text())[0][-1] == "Self-attention (4242)"
    assert "zed" in capsys.readouterr().err
    assert main(["--course", str(course.root), "export", "--format", "moodle"]) != 0  # refused, with the reason


def test_collect_reads_an_lms_export_as_its_roster(course, tmp_path, capsys):
    """Canvas names a submission's files by its user id: its gradebook export is the roster. Its
    names are shown beside the ids (escaped: a name is the LMS's, and may be anything), and the
    roster's students who handed nothing in are named, by collect and by status."""
    import shutil
    course, base = course
    course = Course(shutil.copytree(course.root, tmp_path / "course"))  # the module's course stays as it is
    download = tmp_path / "submissions"
    download.mkdir()
    released = (course.release_dir / NOTEBOOK / f"{NOTEBOOK}.ipynb").read_bytes()
    (download / f"liddellalice_101_98765_{NOTEBOOK}.ipynb").write_bytes(released)
    (download / f"strangerdanger_555_98766_{NOTEBOOK}.ipynb").write_bytes(released)  # not in Canvas's roster
    roster = _write(base / "collect-canvas.csv", CANVAS_EXPORT)
    main(["--course", str(course.root), "collect", str(download), "-a", NOTEBOOK, "--roster", roster])
    assert course.submission_dir("101", NOTEBOOK).is_dir()
    assert not course.submission_dir("555", NOTEBOOK).exists()
    collected = capsys.readouterr().out
    assert f"{NOTEBOOK}: 3 roster students without a submission: 102 (Builder, Bob), 103 (" in collected
    assert "999 (Student, Test)" in collected and "\x1b" not in collected.replace("\\x1b", "")
    assert main(["--course", str(course.root), "status", NOTEBOOK]) == 0
    status = capsys.readouterr().out
    assert "101 (Liddell, Alice)" in status and "3 roster students without a submission" in status
    assert "\x1b" not in status
    assert main(["--course", str(course.root), "export", "-o", str(tmp_path / "grades.csv")]) == 0
    by_id = {r["student"]: r for r in csv.DictReader(io.StringIO((tmp_path / "grades.csv").read_text()))}
    assert by_id["102"]["total"] == "0" and by_id["102"]["flags"] == "nothing handed in"  # in the CSV, as 0


def test_an_lms_export_leaves_out_the_assignments_without_grades_and_says_one_line(course, tmp_path, capsys):
    """Canvas would make an empty assignment of each column the export has no grades for: by
    default only the assignments with grades are exported, the others named in a note that says
    how to export them; the command prints what it wrote, not the file."""
    import shutil
    course, base = course
    course = Course(shutil.copytree(course.root, tmp_path / "course"))
    with course.gradebook() as gb:
        gb.update_or_create_assignment("99_not_yet")
    out = tmp_path / "canvas.csv"
    assert main(["--course", str(course.root), "export", "--format", "canvas", "-o", str(out)]) == 0
    printed = capsys.readouterr()
    rows = _csv(out.read_text())
    assert not any("99_not_yet" in h for h in rows[0])
    assert printed.out.strip() == f"wrote {out}: {len(rows) - 1} rows, {len(rows[0])} columns"
    assert "1 assignment without grades yet left out (99_not_yet)" in printed.err
    assert "workbook export ASSIGNMENT … --format canvas" in printed.err
    assert main(["--course", str(course.root), "export", "-o", "-"]) == 0  # the CSV itself, on request
    assert capsys.readouterr().out.startswith("student,")


def test_status_fits_the_terminal_one_block_an_assignment(course, tmp_path):
    """Side by side, every notebook of every assignment made lines of ~260 columns: past the
    terminal's width each assignment gets a block of its own (``--wide`` keeps one table)."""
    import shutil

    from autograder.reports.status import status_table
    course, base = course
    course = Course(shutil.copytree(course.root, tmp_path / "course"))
    with course.gradebook() as gb:
        gb.update_or_create_assignment("99_not_yet")
    narrow = status_table(course, width=30)
    assert f"\n{NOTEBOOK}:\n" in "\n" + narrow and "\n99_not_yet:\n" in narrow
    wide = status_table(course, width=30, wide=True)
    assert "99_not_yet:" not in wide and wide.splitlines()[0].startswith("student")
    assert status_table(course, width=1000) == wide  # it fits: one table
