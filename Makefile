# Every target installs what it needs: Python packages (uv.lock), Spark's JVM packages
# (tools/jars/pom.xml), the Kafka broker (tools/kafka/pom.xml) and the local control
# plane's binaries (tools/{kube,etcd,helm}).
# Heavy outputs are cached per version under $(PP_CACHE); .cache/ holds links and run state.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-print-directory

PYTHON ?= python3.11
export PP_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/persistent-pipelines
UV_VERSION := 0.13.9
UV := $(PP_CACHE)/uv-$(UV_VERSION)/bin/uv
PY := .venv/bin/python
PYSPARK_JARS = $(shell $(PY) -c 'import pyspark, os; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
PYTEST := $(PY) -m pytest
export UV_PYTHON_DOWNLOADS := never

.PHONY: help
help: ## List the targets with one line each.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[1m%-20s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

## ---- set-up -------------------------------------------------------------------------

$(UV):
	@echo ">>> installing uv $(UV_VERSION) into $(PP_CACHE)"
	$(PYTHON) -m venv $(PP_CACHE)/uv-$(UV_VERSION)
	$(PP_CACHE)/uv-$(UV_VERSION)/bin/pip install --quiet uv==$(UV_VERSION)

.venv/.synced: uv.lock pyproject.toml localcluster/pyproject.toml | $(UV)
	@echo ">>> installing the locked Python packages into .venv (compiled to bytecode once)"
	@# --compile-bytecode: with PYTHONDONTWRITEBYTECODE set (as on this machine and in many CI
	@# images) nothing caches a compiled module, so every Python process compiled pyspark and
	@# numpy from source: 1.25 s of CPU per process against 0.5 s, and a driver starts a dozen
	@# (daemons, workers, source runners). A 6-batch driver run: 58-63 CPU-s against 40-45.
	$(UV) sync --frozen --compile-bytecode --python $(PYTHON)
	@touch $@

.PHONY: venv
venv: .venv/.synced ## Create .venv from uv.lock (pinned; no resolution happens).
	@: # up to date: nothing to say (setup names it as a goal of its own make)

.PHONY: lock
lock: | $(UV) ## Re-resolve uv.lock after editing pyproject.toml.
	$(UV) lock --python $(PYTHON)

.PHONY: jars
jars: venv ## Fetch Delta Lake, hadoop-aws, the AWS SDK, spark-hadoop-cloud and the Kafka connector, compile tools/jars/java, into .cache/jars.
	@tools/jars/install.sh $(PYSPARK_JARS)

.PHONY: kafka
kafka: ## Fetch the Kafka 4.1.1 broker (server, storage and admin tools) into .cache/kafka.
	@tools/kafka/install.sh

.PHONY: bins
bins: ## Build kube-apiserver, kube-controller-manager, kubectl, etcd and helm into .cache/bin.
	@tools/build-go-tools.sh

.PHONY: class-archive
class-archive: venv jars ## Record the driver JVM's class archive (drivers start about 5 s sooner) and unpack RocksDB's native library beside it, once per JVM and jar set.
	@SPARK_APP_CLASS_ARCHIVES=$(PP_CACHE)/class-archives $(PY) -m spark_app.runtime.jvm.class_archive
	@ln -sfn $(PP_CACHE)/class-archives .cache/class-archives

.PHONY: setup
setup: ## Install everything the tests and the demo need (idempotent, cached).
	@# In parallel: the control plane's Go build (CPU) runs while the Python packages, the
	@# jars and the broker download (network), which took about 3.5 of the 15 minutes of a
	@# set-up from empty caches one after the other. Their progress lines interleave (make's
	@# -O would hold each script's lines until it ends); the two Maven fetches take turns
	@# (tools/jars/maven.sh).
	@$(MAKE) -j4 venv jars kafka bins class-archive

## ---- the local control plane --------------------------------------------------------

.PHONY: cluster-up
cluster-up: setup ## Start etcd, kube-apiserver, kube-controller-manager, the node agent and the S3 server on loopback.
	$(PY) -m localcluster up

.PHONY: cluster-down
cluster-down: ## Stop everything cluster-up started (by process id) and keep its data.
	@if [ -x $(PY) ]; then $(PY) -m localcluster down; fi

.PHONY: cluster-clean
cluster-clean: cluster-down ## Stop the local cluster and delete its data (.cache/cluster).
	rm -rf .cache/cluster

.PHONY: cluster-status
cluster-status: ## Show each local cluster process with its port, pid and health.
	$(PY) -m localcluster status

.PHONY: cluster-test
cluster-test: venv bins ## Test the local control plane: pure unit tests, then tests/cluster (starts the cluster if needed).
	$(PYTEST) tests/unit/localcluster -q
	$(PYTEST) tests/integration/localcluster -q

## ---- operator ---------------------------------------------------------------------------
# The PersistentPipeline operator (operator/pipeline_operator), its CRDs (crds/), tests and
# benchmarks. OPERATOR_ARGS passes flags to `python -m pipeline_operator` (see --help).
KUBECONFIG_LOCAL := .cache/cluster/kubeconfig
OPERATOR_ARGS ?=
BENCH_ARGS ?=

.PHONY: operator-crds
operator-crds: ## Apply the CRDs of crds/ (PersistentPipeline, kopf peering) to the local cluster.
	.cache/bin/kubectl --kubeconfig=$(KUBECONFIG_LOCAL) apply -f crds/

.PHONY: operator-run
operator-run: venv ## Run the operator against the local cluster in the foreground (all namespaces; Ctrl-C stops it).
	$(PY) -m pipeline_operator --kubeconfig=$(KUBECONFIG_LOCAL) $(OPERATOR_ARGS)

.PHONY: operator-unit
operator-unit: venv ## Unit tests of the operator: builders, decision function, status (no cluster; make lint checks its layering).
	$(PYTEST) tests/unit/operator -q

.PHONY: operator-test
operator-test: setup ## Operator tests on the local cluster with real kopf and Spark (starts the cluster if needed; ~10 min).
	$(PYTEST) tests/integration/operator -q

.PHONY: bench-operator
bench-operator: setup ## Benchmark the operator (relaunch latency; 100 pipelines: CPU, memory, reconcile latency) into bench/results/.
	$(PY) bench/operator/run.py $(BENCH_ARGS)
## ---- end of operator ----------------------------------------------------------------------

## ---- images / chart / demo / e2e -------------------------------------------------------
# The container images (Dockerfile), the Helm chart (charts/persistent-pipelines), its
# kubectl rendering (deploy/), the demo (demo/) and the end-to-end tests (tests/e2e).
# E2E_ARGS passes pytest arguments to the e2e targets.
IMAGE_TAG := 0.1.0
SPARK_APP_IMAGE := ghcr.io/persistent-pipelines/spark-app:$(IMAGE_TAG)
OPERATOR_IMAGE := ghcr.io/persistent-pipelines/operator:$(IMAGE_TAG)
# The broker of demo/kafka.yaml (the version of tools/kafka/pom.xml; tests/unit/images checks both).
KAFKA_IMAGE := apache/kafka:4.1.1
CHART_DIR := charts/persistent-pipelines
HELM := .cache/bin/helm
KIND_VERSION := v0.30.0
KIND_CLUSTER ?= persistent-pipelines
E2E_ARGS ?=
NO_DOCKER = no Docker engine here (docker info fails)

.PHONY: images
images: ## Build the spark-app and operator images with Docker (tag 0.1.0, as the chart and the CRD default).
	@docker info >/dev/null 2>&1 || { echo "images: $(NO_DOCKER); the local cluster runs the same entrypoints from this checkout."; exit 1; }
	docker build --target spark-app -t $(SPARK_APP_IMAGE) .
	docker build --target operator -t $(OPERATOR_IMAGE) .

.PHONY: chart-lint
chart-lint: bins ## helm lint --strict the chart.
	$(HELM) lint --strict $(CHART_DIR)

.PHONY: chart-test
chart-test: venv bins ## Chart rendering tests, CRD and deploy/ drift, images against the node agent's map.
	$(HELM) lint --strict $(CHART_DIR)
	$(PYTEST) tests/unit/charts tests/unit/images -q $(PYTEST_ARGS)

.PHONY: chart-crds
chart-crds: ## Copy crds/ into the chart after a CRD change (the drift test fails until then).
	cp crds/*.yaml $(CHART_DIR)/crds/

.PHONY: chart-docs
chart-docs: venv ## Regenerate the values table in the chart's README from values.yaml.
	$(PY) charts/values_doc.py $(CHART_DIR)

.PHONY: deploy-manifest
deploy-manifest: bins ## Render deploy/persistent-pipelines.yaml from the chart (the kubectl path).
	deploy/render.sh $(HELM) > deploy/persistent-pipelines.yaml

.PHONY: demo
demo: setup ## The whole story on the local cluster: helm install, three pipelines (one reads a Kafka topic), kill -9 the drivers, resume, summary.
	$(PY) -m demo run

.PHONY: demo-clean
demo-clean: ## Remove what make demo created (release, namespaces, claim folders) and the cluster if it started it.
	@if [ -x $(PY) ]; then $(PY) -m demo clean; fi

.PHONY: e2e
e2e: setup ## End-to-end tests on the local cluster: chart, pipelines, driver kill, resume, helm upgrade/uninstall.
	$(PYTEST) tests/e2e -q $(E2E_ARGS)

.PHONY: e2e-kind
e2e-kind: ## The same e2e tests on a kind cluster with the images built and loaded (needs Docker).
	@if ! docker info >/dev/null 2>&1; then echo "e2e-kind: skipped: $(NO_DOCKER), so kind cannot run; make e2e runs the same tests on the local cluster."; exit 0; fi; \
	$(MAKE) setup images && KIND_VERSION=$(KIND_VERSION) KIND_CLUSTER=$(KIND_CLUSTER) \
	  SPARK_APP_IMAGE=$(SPARK_APP_IMAGE) OPERATOR_IMAGE=$(OPERATOR_IMAGE) KAFKA_IMAGE=$(KAFKA_IMAGE) \
	  E2E_ARGS="$(E2E_ARGS)" tests/e2e/kind.sh
## ---- end of images / chart / demo / e2e -----------------------------------------------

## ---- tests ----------------------------------------------------------------------------
# `make test` is what CI runs (.ci/run). Each suite starts the servers it needs (the local
# cluster, the S3 server) and stops what it started.
PYTEST_ARGS ?=

.PHONY: test
test: setup ## Run every test suite: lint, unit, local cluster, spark_app (real Spark, filesystem and S3), operator, end to end.
	@# The control plane's binaries are built before the tests rather than beside them: on 2 cores
	@# a niced background build during the Spark stage saved nothing (measured from empty caches:
	@# the stage took 1,852 s instead of 1,279 s, the build 1,958 s instead of 515 s).
	@echo ">>> lint"
	@$(MAKE) lint
	@echo ">>> unit tests"
	@# Two workers: 19 s against 39 s in one process (most unit tests are short and CPU-bound).
	$(PYTEST) tests/unit -q -n 2 --durations=5 $(PYTEST_ARGS)
	@echo ">>> local control plane"
	$(PYTEST) tests/integration/localcluster -q --durations=5 $(PYTEST_ARGS)
	@echo ">>> the state layer and spark_app on real Spark (filesystem and S3 backends)"
	@# Two workers: much of a driver test is JVM start-up and waiting (925 s against 1,220 s serial).
	@# Tests marked long (a longer variant of a behaviour a shorter test here covers) are left to
	@# make test-long; the stage is CPU-bound on 2 cores, so only less work makes it shorter.
	$(TEST_JVM) $(PYTEST) $(SPARK_SUITES) -m "not long" -q -n 2 --durations=5 $(PYTEST_ARGS)
	@echo ">>> operator on the local cluster"
	@# Two workers on one cluster (a namespace and an operator per test): most of a test is
	@# waiting for a driver's JVM, a batch or a backoff. The cluster is brought up first and
	@# down after, so that neither worker stops it under the other. `|| status=` because the
	@# recipe's shell stops at the first failing command (-e): `pytest; status=$$?` left the
	@# whole control plane running after a failed test (a cold run of 2026-11-25).
	@# The cluster's node passes its JVM options to the pods (localcluster/README.md), so the
	@# drivers the operator launches compile with C1 only too (TEST_JVM, below).
	$(TEST_JVM) $(PY) -m localcluster up
	status=0; $(PYTEST) tests/integration/operator -q -n 2 --durations=5 $(PYTEST_ARGS) || status=$$?; \
	  $(PY) -m localcluster down; exit $$status
	@echo ">>> end to end: the chart installed, pipelines killed and resumed, helm upgrade and uninstall"
	$(TEST_JVM) $(PYTEST) tests/e2e -q --durations=5 $(PYTEST_ARGS)

# The drivers the tests start compile with C1 only: each lives seconds to minutes, and on 2
# cores C2's compiling is CPU the tests wait for (test_resume.py: 101 s against 92 s; three
# operator tests, their drivers' pods: 69 JVM CPU s against 133). The pipelines of make demo
# and of a user's cluster keep the JVM's defaults. C1 alone gets a 48 MB code cache, which a
# driver of several queries filled in 135 s (a shared-tables test: "CodeCache is full. Compiler
# has been disabled", then batches of 5 s): the tiered default's size is kept.
TEST_JVM := JAVA_TOOL_OPTIONS="-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"

SPARK_SUITES := tests/integration/state tests/integration/spark_app tests/integration/test_kafka_broker.py

.PHONY: test-long
test-long: setup ## The Spark tests make test leaves out (marked long): the example pair of a shared table, its storage over 30 batches, S3 resume, an outage past the budget, SIGTERM in an outage, Kafka kills at random and after a commit, a shared table published before keys were recorded, a paused backfill, the snapshot interval's bound.
	$(TEST_JVM) $(PYTEST) $(SPARK_SUITES) -m long -q -n 2 --durations=10 $(PYTEST_ARGS)

.PHONY: test-unit
test-unit: venv ## Only the fast unit tests (no Spark, no cluster).
	$(PYTEST) tests/unit -q -n 2 --durations=5 $(PYTEST_ARGS)

.PHONY: test-shared-storage
test-shared-storage: setup ## A shared table's storage over 500 batches with its readers current (bounded by the compaction, not the history).
	SHARED_STORAGE_BATCHES=500 $(PYTEST) tests/integration/spark_app/test_shared_tables.py -q -s --timeout 3600 \
	  -k storage_of_a_table_stays_bounded $(PYTEST_ARGS)

.PHONY: test-chaos
test-chaos: setup ## Every chaos family on both backends and on Kafka, CHAOS_ROUNDS rounds (25): kill -9 at random and at each fault point, a shared table's publisher and readers killed at random, a frozen stale driver, storage outages; outputs exact.
	CHAOS_ROUNDS=$${CHAOS_ROUNDS:-25} $(TEST_JVM) $(PYTEST) tests/integration/spark_app/test_crash.py \
	  tests/integration/spark_app/test_chaos.py tests/integration/spark_app/test_table_backfill.py \
	  tests/integration/spark_app/test_shared_chaos.py \
	  tests/integration/spark_app/test_shared_tables.py::test_a_published_table_is_read_as_a_changelog_and_looked_up_exactly \
	  tests/integration/spark_app/test_kafka_source.py::test_kill_9_while_messages_arrive_loses_and_repeats_nothing \
	  tests/integration/spark_app/test_kafka_source.py::test_kill_9_at_each_fault_point_in_turn_loses_and_repeats_nothing \
	  -q -n 2 --durations=10 $(PYTEST_ARGS)

.PHONY: lint
lint: venv ## ruff, the import-layering contracts and mypy (strict for the operator, contract, state, storage) of pyproject.toml.
	.venv/bin/ruff check .
	.venv/bin/lint-imports
	.venv/bin/mypy

## ---- benchmarks ---------------------------------------------------------------------
# Each writes a JSON file with the machine and versions into bench/results/.

.PHONY: bench-persistence
bench-persistence: setup ## What persistence costs against Structured Streaming with the same start-up aids: a driver's start, a small batch's latency, a backlog's throughput.
	$(PY) bench/persistence/run.py $(BENCH_ARGS)

.PHONY: bench-iterate
bench-iterate: setup ## Connected components on 1M edges: cold vs restart, 0.1% inserts, 0.1% deletes.
	$(PY) bench/iterate/run.py $(BENCH_ARGS)

.PHONY: bench-kafka
bench-kafka: setup ## A word count reading a Kafka topic: spark_app vs Structured Streaming, throughput and latency p50/p99.
	$(PY) bench/kafka/run.py $(BENCH_ARGS)

.PHONY: bench-backfill
bench-backfill: setup ## A reader backfilling a 10M-row Delta table that keeps changing: rows/s, rate limits, live-change latency vs Delta's own stream, a kill half way.
	$(PY) bench/backfill/run.py $(BENCH_ARGS)

.PHONY: bench-shared
bench-shared: setup ## Three consumers of one per-customer aggregate: three recomputing pipelines vs a publisher and three readers of its shared table (CPU, state, latency); the publisher's batch latency with 0, 1 and 4 readers.
	$(PY) bench/shared/run.py $(BENCH_ARGS)

.PHONY: bench-iterate-storage
bench-iterate-storage: setup ## What an iterate stores over 200 small batches (bounded by its state, not its history).
	$(PY) bench/iterate/storage.py $(BENCH_ARGS)

.PHONY: bench-resume
bench-resume: setup ## Resume at 1M/4M/16M keys of state (and a deduplication) on a volume and S3 vs the floor and a recompute; 10 vs 1,000 batches of history; snapshot intervals 1/10/60 s.
	$(PY) bench/resume/run.py $(BENCH_ARGS)

.PHONY: bench-recovery
bench-recovery: setup ## Recovery as a user feels it under the operator: driver SIGKILL to the next output line at 1M keys, split into detection, relaunch, driver start-up.
	$(PY) bench/resume/recovery.py $(BENCH_ARGS)
