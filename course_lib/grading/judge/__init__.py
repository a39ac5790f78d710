"""The grader's side of a check: the salt and the run of a spec's sub-checks (``runner``), one
implementation under one spec (``trial``), the shared sub-checks (``properties``), how outputs
differ (``compare``), the scores (``results``), the specs' shape (``spec``) and where they are
found (``registry``). Believes nothing of the student's side but the plain data it returns;
never copied into the sealed course."""
