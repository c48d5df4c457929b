# syntax=docker/dockerfile:1
#
# Two images from one file:
#   docker build --target operator -t fibers:0.1.0 .      the operator: `fibers run` (charts/fibers image)
#   docker build --target job      -t fibers-job:0.1.0 .  Transform drivers and DatabusConsumer pods:
#                                                          adds Java 17, pyspark and the spark-sql-kafka jars
# Both run as the non-root user 10001 with `fibers` as the entry point.
#
# Build arguments (defaults are the versions the project is tested with):
#   PYTHON_IMAGE  the Python base; Debian bookworm, because its openjdk-17 is what Spark 4.0 runs on here
#   MAVEN_IMAGE   only used to fetch the spark-sql-kafka jars with tools/spark-kafka/pom.xml, the same
#                 recipe `fibers stack fetch` uses, so the jars always match the pinned pyspark
#   JAVA_VERSION  the Debian package version of openjdk-17-jre-headless (a glob, so security updates apply)
# Pin PYTHON_IMAGE and MAVEN_IMAGE by digest (name@sha256:…) in a release pipeline.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG MAVEN_IMAGE=maven:3.9.9-eclipse-temurin-17

# ---- the operator's virtualenv -------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS venv
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN /opt/venv/bin/pip install ./

# ---- the jobs' virtualenv: the same, plus the `jobs` extra (pyspark, pymongo, confluent-kafka) ---
FROM venv AS venv-jobs
RUN /opt/venv/bin/pip install ./[jobs]

# ---- spark-sql-kafka and its dependencies, minus what pyspark ships -----------------------------
FROM ${MAVEN_IMAGE} AS spark-kafka-jars
WORKDIR /build
COPY tools/spark-kafka/pom.xml ./
RUN mvn -B -q org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory=/jars

# ---- operator ------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS operator
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --gid 10001 fibers \
 && useradd --uid 10001 --gid fibers --home-dir /home/fibers --create-home --shell /usr/sbin/nologin fibers
COPY --from=venv /opt/venv /opt/venv
WORKDIR /home/fibers
USER 10001:10001
# kopf's liveness probe (/healthz) and metrics, as the chart configures them.
EXPOSE 8080
ENTRYPOINT ["fibers"]
CMD ["run"]

# ---- job -----------------------------------------------------------------------------------------
# Not built here (no container engine on the project machines): tests/integration/test_chart.py
# installs the same files into a clean virtualenv, runs the entry point and the shim, and lints this
# file with hadolint. Open point: Spark on Kubernetes starts driver and executor containers with
# `driver …` / `executor …` as arguments to the entry point (Spark's own images dispatch them in
# their entrypoint.sh); `fibers` does not dispatch them yet, which a real Spark Operator needs.
FROM operator AS job
ARG JAVA_VERSION=17.0.*
USER 0
RUN apt-get update \
 && apt-get install -y --no-install-recommends "openjdk-17-jre-headless=${JAVA_VERSION}" \
 && rm -rf /var/lib/apt/lists/*
COPY --from=venv-jobs /opt/venv /opt/venv
COPY --from=spark-kafka-jars /jars /opt/fibers/jars
# The SparkApplication's mainApplicationFile is local:///opt/fibers/transform_job.py.
RUN printf '%s\n' 'from fibers.jobs.transform import main' 'raise SystemExit(main())' \
      > /opt/fibers/transform_job.py
ENV FIBERS_SPARK_KAFKA_JARS=/opt/fibers/jars \
    PYSPARK_PYTHON=/opt/venv/bin/python
USER 10001:10001
