"""What a released torch_npu wheel offers, read from the wheel's files without installing it
(installing torch-npu where CANN is absent breaks ``import torch``): the wheel is downloaded
(``pip download --no-deps``, into a cache outside the repository) and read as a zip: its Python
files (``torch_npu/__init__.py``, ``torch_npu/npu/*.py``, the ATB op list), the schemas its
libraries register with the dispatcher, the codegen YAML and the ATB C++ API. Nothing of it is
imported or executed. :mod:`tests.engine.npu_uses` reads what the harness asks of it.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tests.engine.npu_uses import Use


@dataclass
class WheelSurface:
    version: str
    npu_names: list[str]  # torch.npu.<name>
    torch_npu_names: list[str]  # torch_npu.<name>
    schemas: dict[str, list[str]]  # "op" / "op.overload" -> argument names, as registered
    callables: dict[str, tuple[list[str], bool]]  # torch.npu name -> (parameter names, takes **kwargs)
    methods: dict[str, list[str]]  # torch.npu class -> method names

    def has(self, use: Use) -> bool:
        root, _, name = use.target.rpartition(".") if use.kind != "overload" else ("", "", "")
        if use.kind == "name":
            return name in (self.npu_names if root == "torch.npu" else self.torch_npu_names)
        if use.kind == "overload":
            return _op(use.target) in self.schemas
        if use.kind == "method":
            return use.detail in self.methods.get(_short(use.target), [])
        op = _op(use.target)
        if op in self.schemas:
            return use.detail in self.schemas[op]
        params, open_kwargs = self.callables.get(_short(use.target), ([], False))
        return open_kwargs or use.detail in params


def _op(target: str) -> str:
    return target.removeprefix("torch_npu.")


def _short(target: str) -> str:
    return target.removeprefix("torch.npu.")


_EXPORTED_SECTIONS = ("autograd", "custom", "quant")  # ops of the npu namespace: torch_npu.<op>


def parse_schema(text: str) -> tuple[str, list[str]] | None:
    """``("op.overload", [argument names])`` of a schema string such as
    ``op.out(Tensor query, *, Tensor? atten_mask=None, Tensor(a!) out) -> ()``; None if it is none."""
    match = re.match(r"\s*([A-Za-z_]\w*(?:\.\w+)?)\(", text)
    if not match:
        return None
    depth, args, current = 1, [], []
    for i in range(match.end(), len(text)):
        char = text[i]
        if char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
            if depth == 0:
                args.append("".join(current))
                if "->" not in text[i:i + 8]:
                    return None
                names = []
                for arg in args:
                    declared = arg.split("=")[0].strip()
                    if declared and declared != "*":
                        names.append(declared.split()[-1])
                return match.group(1), names
        elif char == "," and depth == 1:
            args.append("".join(current))
            current = []
            continue
        current.append(char)
    return None


def _yaml_schemas(text: str) -> tuple[dict[str, list[str]], set[str]]:
    """Schemas of every ``func:`` line of the codegen YAML; the op names of its exported sections."""
    schemas: dict[str, list[str]] = {}
    exported: set[str] = set()
    section = ""
    for line in text.splitlines():
        top = re.match(r"^(\w+):", line)
        if top:
            section = top.group(1)
            continue
        found = line.partition("func:")[2]
        schema = parse_schema(found) if found else None
        if schema:
            schemas[schema[0]] = schema[1]
            if section in _EXPORTED_SECTIONS:
                exported.add(schema[0].split(".")[0])
    return schemas, exported


_REGISTERED = re.compile(rb"(?<=\x00)[A-Za-z_]\w{2,100}(?:\.\w+)?\([^\x00]{0,8000}?\)\s*->[^\x00]*(?=\x00)")


def _library_schemas(library: bytes, ops: set[str]) -> dict[str, list[str]]:
    """The schemas of ``ops`` as a shared library registers them with the dispatcher
    (NUL-terminated ``op.overload(args) -> returns`` strings). These are what a call is checked
    against, and they can differ from the codegen YAML: torch_npu 2.9 and 2.10 register FIA's
    ``.out`` with ``Tensor[] out`` where the YAML says ``attention_out, softmax_lse``."""
    schemas: dict[str, list[str]] = {}
    for match in _REGISTERED.finditer(library):
        schema = parse_schema(match.group(0).decode("latin-1"))
        if schema and schema[0].split(".")[0] in ops:
            schemas.setdefault(schema[0], schema[1])
    return schemas


def _header_parameters(header: str, ops: set[str]) -> dict[str, list[str]]:
    """Parameter names of ``ops`` from their C++ declarations (``TORCH_NPU_API void
    _npu_paged_attention(const at::Tensor &query, ...);``): where a library keeps no whole
    schema string of an op (torch_npu 2.14's ATB library pools its strings), its public C++ API
    still names the arguments as the schema does."""
    found: dict[str, list[str]] = {}
    for match in re.finditer(r"TORCH_NPU_API\s+[^;(]*?\b(\w+)\(([^;]*)\);", header):
        if match.group(1) not in ops:
            continue
        params, depth, current = [], 0, ""
        for char in match.group(2) + ",":
            if char in "<(":
                depth += 1
            elif char in ">)":
                depth -= 1
            if char == "," and depth == 0:
                name = re.search(r"(\w+)\s*(?:=.*)?$", current.strip())
                if name:
                    params.append(name.group(1))
                current = ""
            else:
                current += char
        found.setdefault(match.group(1), params)
    return found


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names.add(target.id)
                    if target.id == "__all__" and isinstance(node.value, (ast.List, ast.Tuple)):
                        names.update(e.value for e in node.value.elts if isinstance(e, ast.Constant))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _params(function: ast.FunctionDef) -> tuple[list[str], bool]:
    args = function.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    return [n for n in names if n not in ("self", "cls")], args.kwarg is not None


_ATB_HEADER = "torch_npu/include/third_party/op-plugin/op_plugin/include/AtbOpsInterface.h"


def read_wheel(path: Path) -> WheelSurface:
    """The surface of the torch_npu wheel at ``path``, from its files (nothing imported)."""
    with zipfile.ZipFile(path) as wheel:
        def text(name: str) -> str:
            return wheel.read(name).decode("utf-8", errors="replace")

        yaml_schemas: dict[str, list[str]] = {}
        exported: set[str] = set()
        for name in wheel.namelist():
            if name.startswith("torch_npu/csrc/aten/") and name.endswith(".yaml"):
                found, names = _yaml_schemas(text(name))
                yaml_schemas.update(found)
                exported |= names
        atb_ops = ast.literal_eval(re.search(r"API_LIST = (\[.*?\])", text("torch_npu/op_plugin/atb/_atb_ops.py"),
                                             re.DOTALL).group(1))
        # The registered schemas; the YAML (the codegen's input) and the ATB C++ API where a
        # library keeps no whole schema string of an op.
        schemas = _library_schemas(wheel.read("torch_npu/lib/libtorch_npu.so"),
                                   {name.split(".")[0] for name in yaml_schemas})
        schemas.update(_library_schemas(wheel.read("torch_npu/lib/libop_plugin_atb.so"), set(atb_ops)))
        for op, args in yaml_schemas.items():
            schemas.setdefault(op, args)
        if _ATB_HEADER in wheel.namelist():
            for op, args in _header_parameters(text(_ATB_HEADER), set(atb_ops) - schemas.keys()).items():
                schemas[op] = args
        callables: dict[str, tuple[list[str], bool]] = {}
        methods: dict[str, list[str]] = {}
        for name in wheel.namelist():
            if re.fullmatch(r"torch_npu/npu/[^/]+\.py", name):
                for node in ast.parse(text(name)).body:
                    if isinstance(node, ast.FunctionDef):
                        callables[node.name] = _params(node)
                    elif isinstance(node, ast.ClassDef):
                        defs = [n for n in node.body if isinstance(n, ast.FunctionDef)]
                        methods[node.name] = sorted(d.name for d in defs)
                        init = next((d for d in defs if d.name == "__init__"), None)
                        callables[node.name] = _params(init) if init else ([], True)
        metadata = text(next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")))
        version = re.search(r"^Version: (.+)$", metadata, re.MULTILINE)
        return WheelSurface(
            version=version.group(1).strip() if version else "?",
            npu_names=sorted(_top_level_names(ast.parse(text("torch_npu/npu/__init__.py")))),
            torch_npu_names=sorted(_top_level_names(ast.parse(text("torch_npu/__init__.py"))) | exported
                                   | set(atb_ops)),
            schemas=schemas,
            callables=callables,
            methods=methods,
        )


def load_surface(wheel: Path) -> WheelSurface:
    """:func:`read_wheel`, kept beside the wheel as JSON (reading the wheel decompresses its
    95 MB library: a second; the JSON: milliseconds). The file name carries a digest of this
    module, so a change to how the wheel is read reads it again."""
    digest = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
    cached = wheel.with_name(f"{wheel.name}.surface-{digest}.json")
    if cached.exists():
        data = json.loads(cached.read_text())
        data["callables"] = {k: (v[0], v[1]) for k, v in data["callables"].items()}
        return WheelSurface(**data)
    surface = read_wheel(wheel)
    partial = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(dataclasses.asdict(surface)))
    os.replace(partial, cached)  # whole or absent: an xdist worker may read it meanwhile
    for stale in wheel.parent.glob(f"{wheel.name}.surface-*.json"):
        if stale != cached:
            stale.unlink(missing_ok=True)
    return surface


# -- getting the wheel ----------------------------------------------------------------------------
def cache_dir() -> Path:
    """Outside the repository: ``$XDG_CACHE_HOME`` (else ``~/.cache``) ``/graph-harness/torch-npu``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "graph-harness" / "torch-npu"


def stack_releases() -> dict[str, list[str]]:
    """The released torch_npu versions the harness's stack profiles model (their summaries name
    them: ``torch_npu 2.10.0.post4``), each with the profiles that model it."""
    from harness.stacks import PROFILES

    releases: dict[str, list[str]] = {}
    for profile in PROFILES.values():
        found = re.search(r"torch_npu (\d+\.\d+\.\d+(?:\.post\d+)?)\b", profile.summary)
        if profile.real and found:
            releases.setdefault(found.group(1), []).append(profile.name)
    return releases


def fetch_wheel(version: str, cache: Path, timeout_s: float = 180.0) -> tuple[Path | None, str]:
    """The cached wheel of torch-npu ``version``, downloaded first if absent (never installed).
    ``(None, why)`` when it cannot be had (no index reachable, no wheel for this platform)."""
    pattern = f"torch_npu-{version}-*.whl"
    found = sorted(cache.glob(pattern))
    if found:
        return found[0], ""
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as private:  # another process may fetch it too
        command = [sys.executable, "-m", "pip", "download", f"torch-npu=={version}", "--no-deps",
                   "--only-binary=:all:", "--disable-pip-version-check", "--timeout", "5", "--retries", "0",
                   "-d", private]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as error:
            return None, f"pip download torch-npu=={version} failed: {error}"
        fetched = sorted(Path(private).glob(pattern))
        if done.returncode != 0 or not fetched:
            last = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["no output"])[-1]
            return None, f"pip download torch-npu=={version} failed (the package index unreachable?): {last}"
        os.replace(fetched[0], cache / fetched[0].name)
    return cache / fetched[0].name, ""
