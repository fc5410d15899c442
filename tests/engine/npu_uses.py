"""What the harness asks of torch_npu, read from the harness's own source with :mod:`ast` (so
it cannot drift from the code); :mod:`tests.engine.npu_wheel` reads what a release offers.

* every ``torch.npu.<name>`` and ``torch_npu.<name>`` in ``harness/engine/npu.py`` and
  ``harness/ops/*.py``;
* an overload taken of an op through a local alias (``op = torch_npu.X; op.out(...)``) and the
  keywords of that call;
* the methods a class of ``npu.py`` overrides on a ``torch.npu`` base class;
* the native hooks: ``npu.py``'s ``native_attention()``, ``native_paged_attention()``: the slots
  each returns (in order), bound by the setter that :mod:`harness.ops.native` calls with them to the
  slots of an ops module (``_native.functional``, ``_native["op"]``), and every keyword that
  ops module passes through each slot (explicit, or from a ``dict(...)``/``{...}`` or a
  ``FiaKeywords.as_kwargs()`` it spreads);
* the keywords every ``engine.<name>(...)`` call in ``harness/`` passes, where ``npu.py`` binds
  ``<name>`` to a ``torch.npu`` callable.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "harness"
NPU_MODULE = HARNESS / "engine" / "npu.py"
OPS_DIR = HARNESS / "ops"
INSTALL = HARNESS / "ops" / "native.py"
SIGNATURE = OPS_DIR / "signature.py"


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
    for name, function in functions.items():  # the engine's hooks: native_attention() and its kin
        if name.startswith("native_"):
            aliases = _aliases(function)
            returned = next(n.value for n in ast.walk(function) if isinstance(n, ast.Return))
            elements = returned.elts if isinstance(returned, ast.Tuple) else [returned]
            hooks[name] = [_slot_target(e, aliases, NPU_MODULE, uses.uses) for e in elements]
    return hooks, bindings


def _setters() -> dict[str, str]:
    """Hook -> the setter harness.ops.native hands its slots to (``set_native_impl(*engine.X())``)."""
    out: dict[str, str] = {}
    for node in ast.walk(_parse(INSTALL)):
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
                elif isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
                        and value.func.attr == "as_kwargs":
                    keys |= _fia_keywords()  # FiaKeywords.as_kwargs(): every field, some changed
                    keys.update(kw.arg for kw in value.keywords if kw.arg)
                elif isinstance(value, ast.Dict):
                    keys.update(k.value for k in value.keys if isinstance(k, ast.Constant))
    return keys


def _fia_keywords() -> set[str]:
    """The fields of ``harness.ops.signature.FiaKeywords``: the one definition of FIA's keywords,
    which its ``as_kwargs()`` spreads into every call of the op."""
    for node in ast.walk(_parse(SIGNATURE)):
        if isinstance(node, ast.ClassDef) and node.name == "FiaKeywords":
            return {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    raise AssertionError(f"{SIGNATURE} defines no FiaKeywords")


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
