"""Reference implementations, data generators, plots, widgets and grading checks
for the attention and transformers workbook.

Modules, one idea each:

- ``course_lib.device``     device choice and seeding
- ``course_lib.attention``  scaled dot-product attention, masks, single-head self-attention
- ``course_lib.plotting``   heatmaps and curves used by the notebooks
- ``course_lib.widgets``    the interactive attention explorer
- ``course_lib.grading``    check specs, mistake catalogues and the ``check`` entry point
"""

__version__ = "0.1.0"
