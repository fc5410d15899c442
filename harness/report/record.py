"""The one place that reads an item's record off a pytest report.

The record has travelled in two ways: as a JSON string in the report's junit
``user_properties`` (results v1), and as a custom report attribute that pytest carries across
xdist workers (results v2). Every reader of the record (the HTML report, the terminal failure
line, the JSON results file) goes through :func:`report_record`, so either transport works and
a change of transport touches this module only.
"""

from __future__ import annotations

import json

from harness.plain import JsonObject
from harness.report.results import RECORD_KEY

__all__ = ["report_record"]


def _decode(value: object) -> JsonObject | None:
    if isinstance(value, dict):
        return value
    if isinstance(value, (str, bytes)):
        try:
            decoded = json.loads(value)
        except ValueError:
            return None
        return decoded if isinstance(decoded, dict) else None
    return None


def report_record(report: object) -> JsonObject | None:
    """The item record a ``call`` report carries, or ``None`` (a plain test, a collection error)."""
    record = _decode(getattr(report, RECORD_KEY, None))
    if record is not None:
        return record
    for name, value in getattr(report, "user_properties", None) or ():
        if name == RECORD_KEY:
            return _decode(value)
    return None
