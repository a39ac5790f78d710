"""``workbook gradescope``: an assignment as a Gradescope autograder (see ``in_container``)."""
