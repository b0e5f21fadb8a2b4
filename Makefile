# lowtide — developer entry points.  On a fresh machine (Python 3.11+, Java 17+, root for
# apt-get):  `make demo`  or  `make test`  — both run `setup` first, which is fast when nothing
# changed.  `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV      := .venv
PY        := $(VENV)/bin/python
PIP_STAMP := $(VENV)/.setup-stamp
PB_STAMP  := services/lowtide_pb/__init__.py
PROTOS    := $(wildcard protos/lowtide/v1/*.proto protos/etcd/*.proto)
PYTEST    := $(PY) -m pytest -q -rs -p no:cacheprovider

PYTEST_ARGS ?=
# The suite runs in TEST_WORKERS pytest-xdist processes (each with its own ports, data directories
# and redis-server; tests/conftest.py). Most tests wait on real processes, so 4 workers overlap their
# waits on 2 cores. --dist loadscope runs a module's tests in one worker, so a module's shared
# cluster starts once. TEST_WORKERS=0 runs in one process. The 25 slowest tests are printed.
TEST_WORKERS ?= 4
PYTEST_PARALLEL = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadscope) --durations=25
BENCH_ARGS  ?=
# Set to 1 to treat "no tests collected" (pytest exit 5) as success (.ci/run does).
ALLOW_NO_TESTS ?=
CONTRACT_CHECK := ../shared/tools/contract-check

# grpcurl, helm and kgo-verifiable-consumer built by scripts/setup.sh live in .tools/bin: visible to every recipe.
export PATH := $(CURDIR)/.tools/bin:$(PATH)

.PHONY: help setup system protos test test-unit test-integration demo bench lint clean distclean \
        contract-check tools kafka-tools kafka-tools-optional chart-lint chaos chaos-diskless chaos-kafka chaos-eos dashboards k8s-build k8s-up k8s-test k8s-down \
        docs

help:
	@echo "make setup             create .venv, install lowtide + deps, generate protos, install system tools"
	@echo "make demo              run the main job (lowtide demo)"
	@echo "make test              all tests, in parallel (PYTEST_ARGS='-k name -x' to narrow, TEST_WORKERS=0 serial)"
	@echo "make test-unit         tests/unit only"
	@echo "make test-integration  tests/integration only (real redis-server, services)"
	@echo "make bench             benchmarks           (BENCH_ARGS=--quick for a short run)"
	@echo "make chaos             random faults + history check (CHAOS_MINUTES=30, CHAOS_SEED=random) -> tests/chaos/RESULTS.md"
	@echo "make chaos-diskless    the same on a diskless topic, with coordinator shard faults too"
	@echo "make chaos-kafka       idempotent Kafka producers (VerifiableProducer, confluent-kafka) under faults (CHAOS_KAFKA_MINUTES=10)"
	@echo "make chaos-eos         Kafka's TransactionalMessageCopier under faults, exactly-once check (EOS_RECORDS=200000 per partition)"
	@echo "make lint              ruff check"
	@echo "make protos            regenerate services/lowtide_pb from protos/"
	@echo "make tools             (re)build grpcurl, helm and kgo-verifiable-consumer (tests/go) into .tools/bin"
	@echo "make kafka-tools       fetch Kafka's CLI tools (.tools/bin/kafka-*) and Spark's Kafka connector from Maven Central"
	@echo "make chart-lint        helm lint + helm template of charts/lowtide"
	@echo "make docs              regenerate the Kafka API table in docs/kafka-compatibility.md from lowtide.kafka"
	@echo "make dashboards        regenerate charts/lowtide/dashboards/*.json and rules/*.yaml from lowtide.observability"
	@echo "make k8s-build         build (once) the local Kubernetes: binaries, base image  (tests/k8s, root)"
	@echo "make k8s-up / k8s-down start / stop a real single-node Kubernetes (KUBECONFIG in ~/.cache/lowtide-k8s/run)"
	@echo "make k8s-test          image + helm install/test/upgrade/uninstall on it, end to end (K8S_KEEP=1 keeps it up)"
	@echo "make contract-check    run ../shared/tools/contract-check against a fresh local cluster"
	@echo "make clean / distclean remove generated files / also .venv and .tools"

# ---- setup ---------------------------------------------------------------------------------
setup: system $(PIP_STAMP) $(PB_STAMP) kafka-tools-optional

# Python environment: rebuilt when pyproject.toml (or the script) changes or .venv is missing.
$(PIP_STAMP): pyproject.toml scripts/venv.sh
	@PYTHON="$(PYTHON)" scripts/venv.sh
	@touch $@

# Generated gRPC/protobuf code: regenerated when a .proto (or the generator) changes.
$(PB_STAMP): $(PROTOS) scripts/gen_protos.sh $(PIP_STAMP)
	@PYTHON=$(PY) scripts/gen_protos.sh

# System packages and Go tools (first: gcc must exist before pip compiles the C record walker):
# checked every time (a few `command -v`; installs only what's missing).
system:
	@scripts/setup.sh

protos: $(PIP_STAMP)
	@PYTHON=$(PY) scripts/gen_protos.sh

tools:
	@scripts/setup.sh --force-tools

# Apache Kafka's own CLI tools (kafka-topics, kafka-console-producer/-consumer, kafka-consumer-groups,
# kafka-delete-records, kafka-acls, kafka-configs, kafka-verifiable-producer, kafka-producer-perf-test,
# kafka-transactions as .tools/bin wrappers) and Spark's Kafka connector jars for .venv's PySpark,
# from Maven Central, cached in ~/.cache/lowtide-kafka-tools (fast when cached; needs java and mvn).
# `make setup` runs it with --optional: a failure is a warning there, except under CI=true.
kafka-tools: $(PIP_STAMP)
	@scripts/kafka_tools.sh

kafka-tools-optional: $(PIP_STAMP)
	@scripts/kafka_tools.sh --optional

# ---- run -----------------------------------------------------------------------------------
# run_pytest(paths): exit 5 (nothing collected) is allowed only with ALLOW_NO_TESTS=1.
define run_pytest
	@rc=0; $(PYTEST) $(PYTEST_PARALLEL) $(1) $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ] && [ "$(ALLOW_NO_TESTS)" = 1 ]; then echo "pytest: no tests collected in $(1)"; rc=0; fi; \
	exit $$rc
endef

test: setup
	$(call run_pytest,tests)

test-unit: setup
	$(call run_pytest,tests/unit)

test-integration: setup
	$(call run_pytest,tests/integration)

demo: setup
	$(VENV)/bin/lowtide demo

bench: setup
	$(PY) -m tests.bench.run $(BENCH_ARGS)

CHAOS_MINUTES ?= 30
CHAOS_SEED    ?=
chaos: setup
	$(PY) -m tests.chaos.run --minutes $(CHAOS_MINUTES) $(if $(CHAOS_SEED),--seed $(CHAOS_SEED)) \
	  --out tests/chaos/RESULTS.md

chaos-diskless: setup
	$(PY) -m tests.chaos.run --diskless --minutes $(CHAOS_MINUTES) $(if $(CHAOS_SEED),--seed $(CHAOS_SEED)) \
	  --out tests/chaos/RESULTS.md

# Kafka's VerifiableProducer and confluent-kafka, idempotent, under replica faults (issue 34)
CHAOS_KAFKA_MINUTES ?= 10
chaos-kafka: setup
	$(PY) -m tests.chaos.kafka_idempotence --minutes $(CHAOS_KAFKA_MINUTES) $(if $(CHAOS_SEED),--seed $(CHAOS_SEED)) \
	  --out tests/chaos/RESULTS.md

# The long run of tests/integration/kafka/test_exactly_once_copier.py (its short run is in make test).
EOS_RECORDS ?= 200000
chaos-eos: setup
	$(PY) -m tests.integration.kafka.test_exactly_once_copier --records $(EOS_RECORDS) $(if $(CHAOS_SEED),--seed $(CHAOS_SEED)) \
	  --out tests/chaos/RESULTS.md

lint: $(PIP_STAMP)
	$(VENV)/bin/ruff check services tests spark-jobs

contract-check: setup
	@if [ -f $(CONTRACT_CHECK) ]; then bash $(CONTRACT_CHECK); \
	else echo "contract-check: $(CONTRACT_CHECK) not present, skipped"; fi

dashboards: $(PIP_STAMP)
	@$(PY) -m lowtide.observability charts/lowtide

# The generated parts of docs/ (tests/unit/kafka/test_compat_doc.py checks they are current).
docs: $(PIP_STAMP) $(PB_STAMP)
	@$(PY) -m lowtide.kafka.compat_doc docs/kafka-compatibility.md

# helm lint --strict and helm template with default and with full values (charts/lowtide/ci); the
# values schema must refuse a wrong value and take an all-digit image tag (skaffold's short git SHA
# can be one, and helm --set makes it an integer); TLS on by default (rediss://, no kubelet gRPC
# probes), off on request, refused without a certificate source, cert-manager Certificates; the Prometheus Operator kinds render when their API is there;
# the replicas' rack from the node (off on request), their drain on scale-down (off on request) and the pre-upgrade scale-down check;
# the etcd members with mutual TLS and every container's LOWTIDE_METADATA_URL, or an external etcd's endpoints (required then).
# (make k8s-test also validates every rendered manifest against a real apiserver.)
chart-lint:
	@if command -v helm >/dev/null; then \
	  set -e; c=charts/lowtide; \
	  helm lint --strict $$c >/dev/null && helm lint --strict $$c -f $$c/ci/full-values.yaml >/dev/null && \
	  helm template lt $$c >/dev/null && helm template lt $$c -f $$c/ci/full-values.yaml >/dev/null && \
	  helm template lt $$c --set redis.enabled=false --set redis.externalUrl=redis://r:6379/0 >/dev/null && \
	  helm template lt $$c --set objectStore.type=none >/dev/null && \
	  helm template lt $$c | grep -q 'rediss://' && ! helm template lt $$c | grep -q '^ *grpc:$$' && \
	  helm template lt $$c --set tls.enabled=false | grep -q '^ *grpc:$$' && \
	  ! helm template lt $$c --set tls.selfSigned=false >/dev/null 2>&1 && \
	  helm template lt $$c --set tls.selfSigned=false --set tls.certManager.issuerRef.name=ca \
	    | grep -q 'kind: Certificate' && \
	  ! helm template lt $$c --set objectStore.type=disk >/dev/null 2>&1 && \
	  helm template lt $$c --set image.tag=5554813 --set spark.image.tag=5554813 \
	    | grep -q 'image: "lowtide:5554813"' && \
	  helm template lt $$c --api-versions monitoring.coreos.com/v1/PrometheusRule \
	    --show-only templates/observability.yaml | grep -q 'kind: PrometheusRule' && \
	  helm template lt $$c --api-versions monitoring.coreos.com/v1/ServiceMonitor \
	    --show-only templates/observability.yaml | grep -q 'kind: ServiceMonitor' && \
	  helm template lt $$c | grep -q -- '--rack "$$(cat /etc/lowtide/rack/rack)"' && \
	  helm template lt $$c | grep -q 'exec lowtide drain --broker "$$ordinal"' && \
	  ! helm template lt $$c --set rackAwareness.enabled=false | grep -Eq 'kind: ClusterRole$$|--rack' && \
	  ! helm template lt $$c --set replica.drainOnScaleDown.enabled=false | grep -q 'preStop' && \
	  helm template lt $$c --is-upgrade --show-only templates/scale-down-check.yaml | grep -q 'helm.sh/hook: pre-upgrade' && \
	  helm template lt $$c | grep -q 'LOWTIDE_METADATA_URL' && helm template lt $$c | grep -q -- '--peer-client-cert-auth' && \
	  helm template lt $$c --set etcd.enabled=false --set 'etcd.externalEndpoints={e1:2379,e2:2379}' \
	    | grep -q 'value: "etcd://e1:2379,e2:2379"' && \
	  ! helm template lt $$c --set etcd.enabled=false >/dev/null 2>&1 && \
	  echo "chart-lint: charts/lowtide ok (default and full values)"; \
	else echo "chart-lint: helm not found (make tools builds it), skipped"; fi

# ---- local Kubernetes (tests/k8s; needs root) -------------------------------------------------
K8S_KEEP ?=
k8s-build: setup
	@bash tests/k8s/build.sh

k8s-up: k8s-build
	@bash tests/k8s/up.sh

k8s-down:
	@bash tests/k8s/down.sh

# build, up, the scenario, down (unless K8S_KEEP=1); the phases' durations are printed at the end
k8s-test: k8s-build
	@rc=0; t0=$$SECONDS; bash tests/k8s/up.sh && bash tests/k8s/test.sh || rc=$$?; \
	[ "$(K8S_KEEP)" = 1 ] || bash tests/k8s/down.sh; \
	echo "k8s-test: exit $$rc after $$((SECONDS - t0))s"; exit $$rc

# ---- clean ---------------------------------------------------------------------------------
clean:
	rm -rf services/lowtide_pb build dist .pytest_cache .ruff_cache tests/bench/out
	find . -path ./.venv -prune -o \( -name __pycache__ -o -name '*.egg-info' \) -prune -exec rm -rf {} +
	rm -f $(PIP_STAMP)

distclean: clean
	rm -rf $(VENV) .tools
