"""The browser tests' one rule: where no Chromium is installed they skip, except under CI.

CI's ``.ci/run`` installs Debian's ``chromium`` when it is missing, so a browser test that
skipped there would hide that the report page was never looked at: with ``CI`` set, the test
runs and fails on the missing browser instead.
"""

from __future__ import annotations

import os

import pytest

from harness.report.browser import find_chromium

needs_chromium = pytest.mark.skipif(
    find_chromium() is None and not os.environ.get("CI"),
    reason="no chromium installed (Debian: apt-get install chromium; under CI this fails instead)")
