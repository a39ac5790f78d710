"""The stages of grading, in order, each a module (its helpers beside it, named after it):

- ``collect`` (``collect_sources``, ``collect_identities``, ``collect_files``, ``collect_times``):
  what students handed in, into ``grading/submitted/``;
- ``prepare``: each notebook read, repaired, fingerprinted and salted: a task and its job;
- ``run`` (``run_protocol``, ``run_transcript``, ``reference_oracle``): the job's notebook in
  its seal, served over one socket; what it kept is the run's outcome;
- ``judge`` (``source_checks``): the outcome judged once the seal is gone;
- ``record``: gradebook, autograded notebook, grading report, as each result arrives.

``autograde`` strings them together; ``handoffs`` holds what one stage hands the next
(task, job, run outcome, worker result); ``options`` how to grade; ``dispatch`` sends the
jobs to a ``worker``: local processes (``pool``), a Dask cluster (``cluster``) or this
process. Imports ``doors/``, ``course/`` and ``sealing/``.
"""
