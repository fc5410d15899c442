"""Scenarios as data: YAML -> validated :class:`Scenario` points (pydantic), matrix expansion.

Pure: imports neither pytest nor torch. See docs/scenarios.md for the file format.
"""

from .errors import ScenarioError, ScenarioFileError, SourceLocation
from .loader import (
    ScenarioPoint,
    apply_overrides,
    load_scenario_file,
    load_scenario_text,
    locate,
    locate_in_point,
    modes_of,
    parse_override,
    render_id,
    render_value,
)
from .schema import (
    CHECK_NAMES,
    GRAPH_MODES,
    ConsistencyError,
    EngineSpec,
    Expect,
    Features,
    Fixes,
    GraphSpec,
    ModelSpec,
    RequestSpec,
    Scenario,
    StepEntry,
    Tolerance,
    Workload,
    check_matrix_path,
    export_json_schema,
)

__all__ = [
    "CHECK_NAMES",
    "GRAPH_MODES",
    "ConsistencyError",
    "EngineSpec",
    "Expect",
    "Features",
    "Fixes",
    "GraphSpec",
    "ModelSpec",
    "RequestSpec",
    "Scenario",
    "ScenarioError",
    "ScenarioFileError",
    "ScenarioPoint",
    "SourceLocation",
    "StepEntry",
    "Tolerance",
    "Workload",
    "apply_overrides",
    "check_matrix_path",
    "export_json_schema",
    "load_scenario_file",
    "load_scenario_text",
    "locate",
    "locate_in_point",
    "modes_of",
    "parse_override",
    "render_id",
    "render_value",
]
