# make test: a virtual environment with the package and its test extras, then the whole suite
# (lint, types, the docs site, the release files, tests). make demo: llm-latency demo, scenes against a built-in loopback server.
# CONSTRAINTS=FILE installs under pip's -c FILE, e.g. the oldest supported set CI also tests:
#   make test VENV=.venv-oldest CONSTRAINTS=constraints/oldest.txt
# mypy checks the code against the annotations of the newest dependencies only (older releases
# annotate some APIs differently without behaving differently): under CONSTRAINTS, TYPECHECK
# defaults to no, and the tests are what check the oldest set.
PYTHON ?= python3
VENV ?= .venv
CONSTRAINTS ?=
TYPECHECK ?= $(if $(CONSTRAINTS),no,yes)
# The examples of README and docs/ run on the newest set only (tests/test_docs_examples.py): the
# trace-file example needs opentelemetry-exporter-otlp-json-file, and no release of it installs
# with the oldest set's opentelemetry-sdk 1.43 (its 0.64b0 requires opentelemetry-proto-json
# 0.64b0, which PyPI does not have; 0.65b0 and later require the SDK 1.44 and later).
DOCS_EXAMPLES ?= $(if $(CONSTRAINTS),no,yes)
# It is installed in the same pip command as the rest, so that the resolver picks versions that
# agree: installed alone afterwards, its 0.66b1 pins opentelemetry-exporter-otlp-common 0.66b1,
# older than the newest OTLP exporters (1.45.2) need, and pip check fails.
DOCS_EXPORTER := 'opentelemetry-exporter-otlp-json-file>=0.65b0,<1'
DOCS_PACKAGES = $(if $(filter yes,$(DOCS_EXAMPLES)),$(DOCS_EXPORTER))
PY := $(VENV)/bin/python
PIP_CONSTRAINTS := $(if $(CONSTRAINTS),-c $(CONSTRAINTS))

.PHONY: test demo bench lint docs dist clean e2e

$(VENV)/.test-installed: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(PIP_CONSTRAINTS) -e '.[test]' $(DOCS_PACKAGES)
	$(PY) -m pip check
	# OpenLLMetry's instrumentations, for tests/programs/openllmetry_call.py only: in a folder of
	# their own, so that opentelemetry-instrument in the other tests does not load them (their
	# entry points are named like openai-v2's).
	$(PY) -m pip install -q $(PIP_CONSTRAINTS) --no-deps --upgrade --target $(VENV)/openllmetry \
		'opentelemetry-instrumentation-openai>=0.62.4,<1' \
		'opentelemetry-instrumentation-anthropic>=0.62.4,<1' \
		'opentelemetry-semantic-conventions-ai>=0.5.1,<0.6'
	touch $@

$(VENV)/.demo-installed: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(PIP_CONSTRAINTS) -e '.[cli]'
	$(PY) -m pip check
	touch $@

lint: $(VENV)/.test-installed
	$(VENV)/bin/ruff check src tests bench examples
	$(VENV)/bin/ruff format --check src tests bench examples
ifeq ($(TYPECHECK),yes)
	$(VENV)/bin/mypy
endif

# The suite waits on real servers and subprocesses more than it computes: three workers. Tests
# marked xdist_group (the wheel builds, the timing tests) run on one worker each group: --dist
# loadgroup (tests/conftest.py fails them where pytest-xdist does not group them).
PYTEST_WORKERS ?= 3

# Prometheus 3 for the created-timestamp test (Debian 12 has 2.42), unpacked from Debian's archive.
PROMETHEUS3 := .tools/prometheus3/usr/bin/prometheus

$(PROMETHEUS3):
	bash .ci/prometheus3

# The documentation site, strictly: a broken link or a page missing from the navigation fails.
docs: $(VENV)/.test-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir $(VENV)/site

# The release files: sdist and wheel in dist/, checked by twine (metadata, README rendering).
dist: $(VENV)/.test-installed
	rm -rf dist
	$(PY) -m build --outdir dist .
	$(VENV)/bin/twine check --strict dist/*

test: lint docs dist $(PROMETHEUS3)
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup --durations=15 --ignore=tests/e2e \
		$(if $(filter yes,$(DOCS_EXAMPLES)),,--ignore=tests/test_docs_examples.py)

# make e2e: the deploy bundle run for real on loopback (tests/e2e/). deploy/build/build-bundle
# builds the Collector, Jaeger, Prometheus and Alertmanager from their Go modules at the
# versions docker-compose.yaml pins, Helm, a kube-apiserver (deploy/build/kube-apiserver/) and
# OpenSearch from Maven Central's jars, into BUNDLE_BUILDS (a build per version: cold, with empty
# Go and Maven caches, 26 minutes on 2 cores beside the unit suites in CI; then seconds). Needs
# Go, Java 17 with Maven, Debian's etcd-server, and root (or user namespaces): each service runs
# in a mount namespace of its own with the compose service names in its /etc/hosts.
BUNDLE_BUILDS ?= .tools/bundle
# The e2e modules wait on the bundle (alert windows, a 20 s outage, restarts, tail-sampling
# decisions) far more than they compute, so they run as three groups side by side, each with a
# bundle of its own on a loopback /24 of its own (LLM_LATENCY_E2E_NET; the services' ports are
# fixed): the compose run, the scale-out path (Helm, the Kubernetes API server, two gateways,
# OpenSearch), and test_metrics again on the GenAI conventions' released names. A module that
# restarts services (test_faults, test_advise) comes last in its group. Each group's output is
# printed whole when it ends (make --output-sync).
E2E_COMPOSE := tests/e2e/test_versions.py tests/e2e/test_traces.py tests/e2e/test_metrics.py \
	tests/e2e/test_storage.py tests/e2e/test_probe.py tests/e2e/test_explain_jaeger.py \
	tests/e2e/test_faults.py
E2E_SCALE_OUT := tests/e2e/test_listening.py tests/e2e/test_tail_sampling.py \
	tests/e2e/test_helm.py tests/e2e/test_opensearch.py tests/e2e/test_k8s_attributes.py \
	tests/e2e/test_advise.py
E2E_NET_BASE ?= 127.0.
E2E_PYTEST = LLM_LATENCY_BUNDLE_BUILDS=$(BUNDLE_BUILDS) $(PY) -m pytest -p no:cacheprovider \
	--timeout 900 --durations=12

.PHONY: e2e-compose e2e-scale-out e2e-genai-names
e2e: $(VENV)/.test-installed
	deploy/build/build-bundle $(BUNDLE_BUILDS)
	$(MAKE) --no-print-directory -j3 --output-sync=target e2e-compose e2e-scale-out e2e-genai-names

e2e-compose:
	LLM_LATENCY_E2E_NET=$(E2E_NET_BASE)10 $(E2E_PYTEST) $(E2E_COMPOSE)

e2e-scale-out:
	LLM_LATENCY_E2E_NET=$(E2E_NET_BASE)11 $(E2E_PYTEST) $(E2E_SCALE_OUT)

# the dashboard and the alerts on the GenAI conventions' released names
e2e-genai-names:
	OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental LLM_LATENCY_E2E_NET=$(E2E_NET_BASE)12 \
		$(E2E_PYTEST) tests/e2e/test_metrics.py

demo: $(VENV)/.demo-installed
	$(VENV)/bin/llm-latency demo

# make bench: the two measures of what llm-latency costs per request, side by side (docs/overhead.md):
# CPU time (bench/overhead.py, 5 rounds, alternating, medians) and instructions counted by
# valgrind's callgrind (bench/instructions.py; valgrind is a bench tool, not a test dependency).
BENCH_OUT := $(VENV)/bench

bench: $(VENV)/.test-installed
	@command -v valgrind >/dev/null || { echo "make bench needs valgrind (callgrind) for bench/instructions.py: apt-get install -y valgrind" >&2; exit 1; }
	mkdir -p $(BENCH_OUT)
	$(PY) bench/overhead.py --json $(BENCH_OUT)/cpu.json
	$(PY) bench/instructions.py --json $(BENCH_OUT)/instructions.json --cpu $(BENCH_OUT)/cpu.json

clean:
	rm -rf $(VENV) .venv-oldest .mypy_cache .ruff_cache .pytest_cache dist site
