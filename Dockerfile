# lowtide image: `lowtide serve replica|frontdoor|...` (ENTRYPOINT is the CLI).
#   docker build -t lowtide .                     services (replica, frontdoor, coordinator, ...)
#   docker build -t lowtide-spark --target spark .  + Java and PySpark, for the Spark jobs
# Redis is not in the image: the chart runs it as its own StatefulSet (or uses an external URL).

# ---- builder: dependencies, generated protobuf code, the lowtide package -------------------
FROM python:3.11-slim AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/lowtide
ENV PATH=/opt/lowtide/bin:$PATH
WORKDIR /src
# Generate services/lowtide_pb first (grpcio-tools), then install the package non-editable:
# setuptools finds lowtide and lowtide_pb under services/.
COPY pyproject.toml ./
COPY scripts/gen_protos.sh scripts/
COPY protos protos
RUN pip install "grpcio-tools>=1.66,<2"
COPY services services
RUN PYTHON=/opt/lowtide/bin/python bash scripts/gen_protos.sh \
 && pip install . \
 && python -c "import lowtide, lowtide_pb; print('lowtide image ok')"

# ---- runtime: the virtual environment only ------------------------------------------------
FROM python:3.11-slim AS runtime
ENV PATH=/opt/lowtide/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin lowtide \
 && mkdir -p /var/lib/lowtide && chown lowtide /var/lib/lowtide
COPY --from=builder /opt/lowtide /opt/lowtide
USER 10001
WORKDIR /home/lowtide
# gRPC (frontdoor 9090, replica 9092) and Prometheus metrics (9100)
EXPOSE 9090 9092 9100
ENTRYPOINT ["lowtide"]
CMD ["--help"]

# ---- spark: runtime + Java + PySpark + the jobs (Kubernetes Job/CronJob image) -------------
FROM runtime AS spark
USER root
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends default-jre-headless procps \
 && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir "pyspark>=4.0,<5" "pyarrow>=15"
COPY spark-jobs /opt/lowtide-spark-jobs
ENV PYSPARK_PYTHON=/opt/lowtide/bin/python
USER 10001

# default target: the services image
FROM runtime
