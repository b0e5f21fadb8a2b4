# lowtide image: one image for every service, its ENTRYPOINT is the `lowtide` CLI
# (`lowtide serve replica|frontdoor|coordinator|orphan-scanner`, `lowtide topics ...`).
#   docker build -t lowtide .                          services
#   docker build -t lowtide-spark --target spark .     + Java, PySpark and spark-jobs/ (Jobs, CronJob)
#   docker build --build-arg BASE_IMAGE=my-debian-python3.11 ...   another base (the local
#       Kubernetes harness uses a debootstrap'ed Debian bookworm, as no registry is reachable there)
# Redis is not in the image: the chart runs it as its own StatefulSet (or uses an external URL).
# etcd and etcdctl are in it (the chart's etcd StatefulSet runs this image by default): from
# docker/etcd/ when it holds them, else Debian's packages (see below).
# Runs as uid 10001 and writes only to /var/lib/lowtide (data) and /tmp: readOnlyRootFilesystem works.
ARG BASE_IMAGE=python:3.11-slim

# ---- builder: dependencies, generated protobuf code, the lowtide package ----------------------
FROM ${BASE_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
# A C compiler builds the record walkers (lowtide.record._validate/_columns); without one they fall
# back to slow pure Python, so install it when the base lacks it (python:3.11-slim has headers only).
RUN if ! command -v gcc >/dev/null; then \
      apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends gcc libc6-dev \
      && rm -rf /var/lib/apt/lists/*; \
    fi
RUN python3 -m venv /opt/lowtide
ENV PATH=/opt/lowtide/bin:$PATH
WORKDIR /src
# Dependencies first (their layer is reused while only the code changes), then the generated code
# (services/lowtide_pb, grpcio-tools) and the package itself, non-editable.
COPY pyproject.toml ./
RUN python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
      > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt
# etcd and etcdctl, on the PATH in /opt/lowtide/bin: the chart's etcd members run this image (its
# etcd.image defaults to it). From docker/etcd/ when the context holds both binaries (the local
# Kubernetes harness copies the host's there), else Debian's etcd-server and etcd-client packages;
# without either (no apt-get, or no network) the image has no etcd: set the chart's etcd.image then.
COPY docker/etcd/ /tmp/etcd/
RUN if [ ! -x /tmp/etcd/etcd ] || [ ! -x /tmp/etcd/etcdctl ]; then \
      { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
          etcd-server etcd-client >/dev/null && cp /usr/bin/etcd /usr/bin/etcdctl /tmp/etcd/ \
          && rm -rf /var/lib/apt/lists/*; } || echo "WARNING: no etcd in this image (docker/etcd/README.md)"; \
    fi \
 && if [ -x /tmp/etcd/etcd ] && [ -x /tmp/etcd/etcdctl ]; then \
      install -m 0755 /tmp/etcd/etcd /tmp/etcd/etcdctl /opt/lowtide/bin/ && /opt/lowtide/bin/etcd --version | head -n 1; \
    fi \
 && rm -rf /tmp/etcd
COPY scripts/gen_protos.sh scripts/
COPY protos protos
COPY services services
RUN PYTHON=/opt/lowtide/bin/python bash scripts/gen_protos.sh \
 && pip install --no-deps . \
 && python -c "import lowtide, lowtide_pb, lowtide.record._validate; print('lowtide image ok')"

# ---- runtime: the virtual environment only -----------------------------------------------------
FROM ${BASE_IMAGE} AS runtime
ENV PATH=/opt/lowtide/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/tmp
RUN useradd --uid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin lowtide \
 && mkdir -p /var/lib/lowtide && chown 10001:10001 /var/lib/lowtide
COPY --from=builder /opt/lowtide /opt/lowtide
USER 10001
WORKDIR /tmp
# gRPC (front door 9090, replica 9092, coordinator 9094, orphan scanner 9096) and metrics (9100)
EXPOSE 9090 9092 9094 9096 9100
ENTRYPOINT ["lowtide"]
CMD ["--help"]

# ---- spark: runtime + Java + PySpark + the jobs (Kubernetes Job/CronJob image) -----------------
FROM runtime AS spark
USER root
RUN if ! command -v java >/dev/null; then \
      apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        openjdk-17-jre-headless procps && rm -rf /var/lib/apt/lists/*; \
    fi
RUN pip install --no-cache-dir "pyspark>=4.2,<5" "pyarrow>=15"
COPY spark-jobs /opt/lowtide-spark-jobs
# Spark writes only under /tmp (spark.local.dir, java.io.tmpdir, Ivy): readOnlyRootFilesystem works
ENV PYSPARK_PYTHON=/opt/lowtide/bin/python SPARK_LOCAL_DIRS=/tmp JAVA_TOOL_OPTIONS=-Djava.io.tmpdir=/tmp
USER 10001
# no entrypoint: a Job names its program, e.g. ["python", "/opt/lowtide-spark-jobs/retention.py", ...]
ENTRYPOINT []
CMD ["python", "/opt/lowtide-spark-jobs/retention.py", "--help"]

# default target: the services image
FROM runtime
