"""The two doors of the instructor's side: what students hand in comes in through ``intake``
(checked against explicit limits before anything touches it), and every string a student
controlled goes out through ``outbound`` (terminal, CSV, HTML). The ground floor: these
modules import nothing else of the autograder, and every folder above may use them.
"""
