"""Reports of a run: the per-item record and JSON results file, the HTML report, the terminal line.

``record`` reads an item's record off a pytest report (whichever way it travelled); ``view``
derives what a triager reads first; ``html`` and its ``templates/`` lay it out; ``charts``
draws the pictures; ``html_hooks`` is the pytest-html glue; ``terminal`` writes the failure
line; ``browser`` opens a report in headless Chromium for the tests and benchmarks.
"""
