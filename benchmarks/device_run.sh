#!/usr/bin/env bash
# One prepared run for a lent GPU (or NPU) machine: issue 25's device evidence in one call.
#
#   bash benchmarks/device_run.sh [OUT]        # OUT: $OUT, else reports/device-run
#
# 1. environment: torch, CUDA, the device count, the commit (env.txt);
# 2. the missing Python packages from $WHEELS (a folder of wheels: device machines may have no
#    package index; torch is the machine's own), else from the index;
# 3. benchmarks/device_check.py without the scenario comparison (device_check.log);
# 4. the whole library in all five modes on the device and on the emulator, item by item
#    (verdicts.txt, verdicts.json and both results files), bounded by $VERDICT_BUDGET seconds.
#
# Where no device is present, step 3 prints "SKIP: no GPU or NPU" and step 4 is skipped: the
# script exits 0 and says so. Exit 1: a check failed or a verdict differs.
set -u
cd "$(dirname "$0")/.."
out=${1:-${OUT:-reports/device-run}}
py=${PYTHON:-python3}
mkdir -p "$out"

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  "$py" -c 'import sys, torch; print("python", sys.version.split()[0]); print("torch", torch.__version__,
"cuda", torch.cuda.is_available(), "devices", torch.cuda.device_count() if torch.cuda.is_available() else 0)'
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
} > "$out/env.txt" 2>&1
cat "$out/env.txt"

missing=$("$py" - <<'EOF'
import importlib.util
need = {"pydantic": "pydantic", "deepdiff": "deepdiff", "pytest_html": "pytest-html", "allpairspy": "allpairspy",
        "yaml": "PyYAML", "jinja2": "Jinja2", "xdist": "pytest-xdist", "pytest_timeout": "pytest-timeout"}
print(" ".join(pkg for mod, pkg in need.items() if importlib.util.find_spec(mod) is None))
EOF
)
if [ -n "$missing" ]; then
  echo "installing: $missing"
  if [ -n "${WHEELS:-}" ]; then
    "$py" -m pip install --quiet --no-index --find-links "$WHEELS" $missing
  else
    "$py" -m pip install --quiet $missing
  fi || { echo "FAIL: could not install $missing (set WHEELS to a folder of wheels)"; exit 1; }
fi

status=0
timeout 240 "$py" benchmarks/device_check.py --no-verdicts > "$out/device_check.log" 2>&1 || status=1
tail -12 "$out/device_check.log"
if grep -q "^SKIP: no GPU or NPU" "$out/device_check.log"; then
  echo "no device here: the library comparison is skipped"
  exit 0
fi

modes=NONE,PIECEWISE,FULL,FULL_DECODE_ONLY,FULL_AND_PIECEWISE
workers=$("$py" -c 'import os; print(max(1, min(8, (os.cpu_count() or 2) // 2)))')
timeout $(( ${VERDICT_BUDGET:-480} + 60 )) "$py" benchmarks/device_check.py --no-device-checks \
  --scenarios scenarios/ --mode="$modes" --workers "$workers" --verdict-budget "${VERDICT_BUDGET:-480}" \
  --out "$out" > "$out/verdicts.log" 2>&1 || status=1
tail -5 "$out/verdicts.log"
exit $status
