"""The stages of grading, in order: ``collect`` (submissions into ``grading/submitted/``),
``prepare`` (each notebook read, repaired, salted: a job), ``run`` (the job's notebook in its
seal, served over one socket), ``judge`` (its answers judged once the seal is gone) and
``record`` (gradebook, autograded notebook, report); ``autograde`` strings them together,
``worker``, ``pool`` and ``cluster`` carry jobs to where they run. Imports ``doors/``,
``course/`` and ``sealing/``.
"""
