"""Where a run came from: command line, times, git commit, versions, device and backend.

A nightly diff is only as useful as the answer to "what changed between the two runs", so the
results file and the junit suite properties carry this once per run. Everything here is read
without side effects: torch_npu's version comes from its package metadata (never an import:
importing it where CANN is absent breaks torch), CANN's from the toolkit's version files.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

from harness.plain import JsonObject

#: Where a CANN toolkit says its version (the first one found wins).
CANN_HOMES = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")
CANN_DEFAULT_HOME = "/usr/local/Ascend/ascend-toolkit/latest"
CANN_VERSION_FILES = ("compiler/version.info", "version.info", "*/ascend_toolkit_install.info")


def git_commit(root: Path) -> JsonObject:
    """``{"commit": sha, "dirty": bool}`` of the checkout at ``root``, or {} outside one."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return {}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status)}


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def cann_version() -> str | None:
    homes = [os.environ[v] for v in CANN_HOMES if os.environ.get(v)] + [CANN_DEFAULT_HOME]
    for home in homes:
        base = Path(home)
        for pattern in CANN_VERSION_FILES:
            for path in sorted(base.glob(pattern)):
                try:
                    text = path.read_text(errors="replace")
                except OSError:
                    continue
                found = re.search(r"^\s*version\s*=\s*(\S+)", text, re.IGNORECASE | re.MULTILINE)
                if found:
                    return found.group(1)
    return None


def environment(backend: str) -> JsonObject:
    """Versions, device and backend; ``backend`` may be ``auto`` (resolved here).

    On the emulator this imports no torch: an xdist controller describes the run before it
    starts its workers, and an import there would delay every worker by seconds."""
    import harness
    from harness.engine import device_name, resolve

    resolved = resolve(backend)
    env: JsonObject = {
        "harness": harness.__version__,
        "python": platform.python_version(),
        "torch": torch_version(),
        "backend": resolved,
    }
    try:
        env["device"] = device_name(resolved)
    except Exception as error:  # noqa: BLE001 - an absent device is reported per item, not here
        env["device"] = f"unavailable ({type(error).__name__}: {error})"
    if resolved == "cuda":
        import torch

        if torch.version.cuda:
            env["cuda"] = torch.version.cuda
    for key, value in (("torch_npu", package_version("torch_npu") or package_version("torch-npu")),
                       ("cann", cann_version())):
        if value:
            env[key] = value
    env["platform"] = platform.platform()
    return env


def torch_version() -> str | None:
    """The version of torch in use: the imported module's, else the installed package's."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return str(torch.__version__)  # a TorchVersion is not plain data for execnet
    return package_version("torch")


def suite_properties(run: JsonObject) -> list[tuple[str, str]]:
    """What junit's ``<testsuite><properties>`` says once for the whole run."""
    env = run.get("environment") or {}
    props = [("graph_harness_results_schema", str(run.get("schema", "")))]
    if run.get("commit"):
        props.append(("commit", f"{run['commit']}{' (dirty)' if run.get('dirty') else ''}"))
    for key in ("backend", "device", "harness", "torch", "torch_npu", "cann", "cuda", "python"):
        if env.get(key):
            props.append((key, str(env[key])))
    return props
