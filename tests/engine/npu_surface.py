"""torch_npu's surface, both ends, without torch_npu: what the harness asks of it, read from the
harness's own source, and what a released torch_npu wheel offers, read from the wheel's files.

Installing torch-npu where CANN is absent breaks ``import torch``, so the wheel is downloaded
(``pip download --no-deps``, into a cache outside the repository) and read as a zip: its Python
files (``torch_npu/__init__.py``, ``torch_npu/npu/*.py``, the ATB op list), its op schemas (the
codegen YAML of the ``npu`` ops; the ATB ops' schema strings, which live only in
``libop_plugin_atb.so``). Nothing of it is imported or executed.

The harness's side is read with :mod:`ast`, so it cannot drift from the code:

* every ``torch.npu.<name>`` and ``torch_npu.<name>`` in ``harness/engine/npu.py`` and
  ``harness/ops/*.py``;
* an overload taken of an op through a local alias (``op = torch_npu.X; op.out(...)``) and the
  keywords of that call;
* the methods a class of ``npu.py`` overrides on a ``torch.npu`` base class;
* the native hooks: ``npu.py``'s ``Capabilities(native_attention=f, ...)``: the slots ``f``
  returns (in order), bound by the setter that :mod:`harness.session` calls with them to the
  slots of an ops module (``_native.functional``, ``_native["op"]``), and every keyword that
  ops module passes through each slot (explicit, or from a ``dict(...)``/``{...}`` it spreads);
* the keywords every ``engine.<name>(...)`` call in ``harness/`` passes, where ``npu.py`` binds
  ``<name>`` to a ``torch.npu`` callable.
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
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "harness"
NPU_MODULE = HARNESS / "engine" / "npu.py"
OPS_DIR = HARNESS / "ops"
SESSION = HARNESS / "session.py"


# -- the harness's side ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Use:
    """One thing the harness asks of torch_npu. ``kind``: ``name`` (``target`` must exist),
    ``overload`` (op ``target`` must have it), ``method`` (class ``target`` must have
    ``detail``), ``keyword`` (callable or op overload ``target`` must take ``detail``)."""

    kind: str
    target: str
    detail: str
    where: str

    def __str__(self) -> str:
        what = {"name": self.target, "overload": self.target, "method": f"{self.target}.{self.detail}",
                "keyword": f"{self.target}(..., {self.detail}=...)"}[self.kind]
        return f"{self.where}: {what}"


@dataclass
class HarnessUses:
    uses: list[Use] = field(default_factory=list)
    forwarded: list[tuple[str, str, str]] = field(default_factory=list)
    """(op target, where, sibling op target): a slot call that forwards its function's own
    ``**kwargs``, documented as the sibling's keywords (``get_max_workspace``: "the same keyword
    arguments as npu_fused_infer_attention_score")."""


def _chain(node: ast.AST) -> str | None:
    """``torch.npu.graph`` for an attribute chain rooted at a name, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _torch_npu_target(node: ast.AST) -> str | None:
    """``torch.npu.X`` / ``torch_npu.X`` (first name after the root), else None."""
    chain = _chain(node)
    if chain is None:
        return None
    for root in ("torch.npu.", "torch_npu."):
        if chain.startswith(root) and len(chain) > len(root):
            return root + chain[len(root):].split(".")[0]
    return None


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _names(tree: ast.AST, path: Path) -> list[Use]:
    seen: dict[str, Use] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            target = _torch_npu_target(node)
            if target and target not in seen:
                seen[target] = Use("name", target, "", _where(path, node))
    return list(seen.values())


def _aliases(function: ast.AST) -> dict[str, str]:
    """Local names bound to a torch_npu object in ``function`` (``op = torch_npu.X``)."""
    out: dict[str, str] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target = _torch_npu_target(node.value)
            if target:
                out[node.targets[0].id] = target
    return out


def _slot_target(element: ast.AST, aliases: dict[str, str], path: Path, uses: list[Use]) -> str | None:
    """What one element of a native hook's returned tuple is: an op, or an overload of one."""
    if isinstance(element, ast.Name) and element.id in aliases:
        return aliases[element.id]
    if isinstance(element, ast.Attribute):
        return _torch_npu_target(element)
    if isinstance(element, ast.Lambda) and isinstance(element.body, ast.Call):
        call = element.body
        func = call.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in aliases:
            target = f"{aliases[func.value.id]}.{func.attr}"
            uses.append(Use("overload", target, "", _where(path, element)))
            uses.extend(Use("keyword", target, kw.arg, _where(path, element)) for kw in call.keywords if kw.arg)
            return target
    return None


def _npu_module_uses(uses: HarnessUses) -> tuple[dict[str, list[str | None]], dict[str, str]]:
    """Names, overloads, overridden methods of ``npu.py``; its native hooks (capability ->
    slot targets, in order) and its engine bindings (name -> ``torch.npu.X``)."""
    tree = _parse(NPU_MODULE)
    uses.uses.extend(_names(tree, NPU_MODULE))
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    hooks: dict[str, list[str | None]] = {}
    bindings: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                base_target = _torch_npu_target(base)
                if base_target is None:
                    continue
                bindings[node.name] = base_target
                for item in node.body:
                    if isinstance(item, ast.FunctionDef):
                        uses.uses.append(Use("method", base_target, item.name, _where(NPU_MODULE, item)))
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            target = _torch_npu_target(node.value)
            if target and target.startswith("torch.npu."):
                bindings[name] = target
            if isinstance(node.value, ast.Call) and _chain(node.value.func) == "Capabilities":
                for kw in node.value.keywords:
                    if kw.arg and kw.arg.startswith("native_") and isinstance(kw.value, ast.Name):
                        function = functions[kw.value.id]
                        aliases = _aliases(function)
                        returned = next(n.value for n in ast.walk(function) if isinstance(n, ast.Return))
                        elements = returned.elts if isinstance(returned, ast.Tuple) else [returned]
                        hooks[kw.arg] = [_slot_target(e, aliases, NPU_MODULE, uses.uses) for e in elements]
    return hooks, bindings


def _setters() -> dict[str, str]:
    """Capability -> the setter the session hands its hooks to (``set_native_impl(*caps.X())``)."""
    out: dict[str, str] = {}
    for node in ast.walk(_parse(SESSION)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            for sub in ast.walk(ast.Module(body=[ast.Expr(a) for a in node.args], type_ignores=[])):
                if isinstance(sub, ast.Attribute) and sub.attr.startswith("native_"):
                    out[sub.attr] = node.func.id
    return out


def _slots(tree: ast.Module, setter: str) -> list[str]:
    """The ops module's slot names, in the order of ``setter``'s parameters."""
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == setter)
    params = [a.arg for a in function.args.args]
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    for node in ast.walk(function):
        if not isinstance(node, ast.Assign):
            continue
        target, value = node.targets[0], node.value
        if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):  # _native["op"], ... = fn, ...
            by_param = {v.id: t.slice.value for t, v in zip(target.elts, value.elts)
                        if isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant) and isinstance(v, ast.Name)}
            return [by_param[p] for p in params]
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in classes:
            fields = [s.target.id for s in classes[value.func.id].body
                      if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
            by_param = {a.id: fields[i] for i, a in enumerate(value.args) if isinstance(a, ast.Name)}
            return [by_param[p] for p in params]
    raise AssertionError(f"cannot read the slots {setter} fills")


def _slot_of(func: ast.AST) -> str | None:
    """``_native.out`` -> ``out``; ``_native["op"]`` -> ``op``."""
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "_native":
        return func.attr
    if (isinstance(func, ast.Subscript) and isinstance(func.value, ast.Name) and func.value.id == "_native"
            and isinstance(func.slice, ast.Constant)):
        return func.slice.value
    return None


def _spread_keys(name: str, function: ast.FunctionDef) -> set[str] | None:
    """The keys of the dict a function spreads as ``**name``; None when ``name`` is the
    function's own ``**kwargs`` (unknown here)."""
    if function.args.kwarg is not None and function.args.kwarg.arg == name:
        return None
    keys: set[str] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            for value in ast.walk(node.value):
                if isinstance(value, ast.Call) and _chain(value.func) == "dict":
                    keys.update(kw.arg for kw in value.keywords if kw.arg)
                elif isinstance(value, ast.Dict):
                    keys.update(k.value for k in value.keys if isinstance(k, ast.Constant))
    return keys


def _ops_module_uses(path: Path, setter: str, targets: list[str | None], uses: HarnessUses) -> None:
    tree = _parse(path)
    uses.uses.extend(_names(tree, path))
    slot_target = dict(zip(_slots(tree, setter), targets))
    first = next((t for t in targets if t), None)
    for function in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
        for call in [n for n in ast.walk(function) if isinstance(n, ast.Call)]:
            slot = _slot_of(call.func)
            target = slot_target.get(slot) if slot else None
            if target is None:
                continue
            where = _where(path, call)
            keywords = {kw.arg for kw in call.keywords if kw.arg}
            for kw in call.keywords:
                if kw.arg is None and isinstance(kw.value, ast.Name):
                    spread = _spread_keys(kw.value.id, function)
                    if spread is None:
                        uses.forwarded.append((target, where, first or target))
                    else:
                        keywords |= spread
            uses.uses.extend(Use("keyword", target, k, where) for k in sorted(keywords))


def _engine_call_uses(bindings: dict[str, str], uses: HarnessUses) -> None:
    """Keywords of ``engine.X(...)`` / ``self.engine.X(...)`` calls anywhere in ``harness/``."""
    for path in sorted(HARNESS.rglob("*.py")):
        if path == NPU_MODULE:
            continue
        for node in ast.walk(_parse(path)):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner = node.func.value
            is_engine = (isinstance(owner, ast.Name) and owner.id == "engine") or (
                isinstance(owner, ast.Attribute) and owner.attr == "engine")
            target = bindings.get(node.func.attr) if is_engine else None
            if target:
                uses.uses.extend(Use("keyword", target, kw.arg, _where(path, node)) for kw in node.keywords if kw.arg)


def harness_uses() -> HarnessUses:
    """Everything the harness asks of torch_npu (see the module docstring)."""
    uses = HarnessUses()
    hooks, bindings = _npu_module_uses(uses)
    setters = _setters()
    for capability, targets in hooks.items():
        setter = setters[capability]
        module = next(p for p in sorted(OPS_DIR.glob("*.py"))
                      if re.search(rf"^def {setter}\(", p.read_text(), re.MULTILINE))
        _ops_module_uses(module, setter, targets, uses)
    for path in sorted(OPS_DIR.glob("*.py")):  # names anywhere in harness/ops (none import torch_npu today)
        uses.uses.extend(u for u in _names(_parse(path), path) if u not in uses.uses)
    _engine_call_uses(bindings, uses)
    return uses


# -- the wheel's side -----------------------------------------------------------------------------
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
