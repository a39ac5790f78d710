"""Cells of a hostile notebook shared by the tests that grade them (tests/grading/)."""

# A cell that swallows every interrupt: the grader must stop it after the cell's limit and grace.
SWALLOWS = r'''
while True:
    try:
        while True:
            pass
    except KeyboardInterrupt:
        pass
'''
