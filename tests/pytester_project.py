"""What the tests that drive the plugin through pytester share: the project and its scenario.

Test modules that use it still import ``harness.pytest_plugin``, ``harness.report.html`` and
``harness.session`` themselves, so that pytester's in-process runs find them in ``sys.modules``
(torch.library ops can be defined only once per process).
"""

from __future__ import annotations

import pytest

#: A scenario that passes quickly; ``{mode}`` (e.g. ``", mode: FULL"``) and ``{extra}`` (more
#: top-level YAML) are filled in by the test.
TINY = """
name: tiny
graph: {{capture_sizes: [1, 2, 4]{mode}}}
steps: 3
workload:
  requests:
    - {{prompt_len: 3, output_len: 3}}
{extra}
"""


def harness_project(pytester: pytest.Pytester) -> pytest.Pytester:
    """``pytester``'s directory as a project whose conftest registers the harness plugin."""
    pytester.makeconftest('pytest_plugins = ["harness.pytest_plugin"]')
    return pytester
