"""The ``workbook`` subcommands, one function each (``handler(course, args, extra) -> exit status``),
grouped by what they do: :mod:`.machine` (this machine and the course's setup), :mod:`.grading`
(release to feedback) and :mod:`.results` (what reads the grades). autograder/cli.py parses the
command line and calls the one asked for."""
