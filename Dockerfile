# syntax=docker/dockerfile:1
#
# Two images from one file:
#   docker build --target operator -t fibers:0.2.0 .      the operator: `fibers run` (charts/fibers image)
#   docker build --target job      -t fibers-job:0.2.0 .  Transform drivers and executors (Spark on Kubernetes)
#                                                          and DatabusConsumer pods: adds Java 17, pyspark, the
#                                                          spark-sql-kafka jars, tini and docker/job-entrypoint.sh
# Both run as the non-root user fibers (10001:10001, with a passwd entry and a HOME), Python is Debian's
# (python3 + a virtualenv at /opt/venv). The job image also works with a read-only root filesystem when
# /tmp is writable (an emptyDir).
#
# Build arguments (defaults are the versions the project is tested with):
#   BASE_IMAGE      Debian bookworm: its Python 3.11 and openjdk-17 are what Spark 4.0 runs on here
#                   (the local stack passes a debootstrap-made bookworm, see stack/fibers_stack/images.py)
#   MAVEN_IMAGE     only used to fetch the spark-sql-kafka jars with tools/spark-kafka/pom.xml, the same
#                   recipe `fibers-stack fetch` uses, so the jars always match the pinned pyspark
#   PYTHON_VERSION, JAVA_VERSION, TINI_VERSION   Debian package versions (globs, so security updates apply)
# Build-time only, never in an image (for machines behind a TLS-inspecting proxy; a plain build needs none):
#   PIP_CERT        a CA bundle for pip, mounted for the build (buildah bud -v <bundle>:/run/build-ca.crt:ro)
#   MAVEN_OPTS      JVM options for Maven, e.g. -Djavax.net.ssl.trustStore=<a mounted truststore>
# Pin BASE_IMAGE and MAVEN_IMAGE by digest (name@sha256:…) in a release pipeline.

ARG BASE_IMAGE=debian:bookworm-slim
ARG MAVEN_IMAGE=maven:3.9.9-eclipse-temurin-17

# ---- Debian's Python and the fibers user: the base of both images ----------------------------------
FROM ${BASE_IMAGE} AS python
ARG PYTHON_VERSION=3.11.*
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends "python3=${PYTHON_VERSION}" "python3-venv=${PYTHON_VERSION}" \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 fibers \
 && useradd --uid 10001 --gid fibers --home-dir /home/fibers --create-home --shell /usr/sbin/nologin fibers
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# ---- the dependencies, from pyproject.toml alone ---------------------------------------------------
# Installed before the operator's own code is copied, so editing operator/ rebuilds only the small
# layer with the fibers wheel, not the (for the job image, 500 MB) dependency layer.
FROM python AS requirements
COPY pyproject.toml /src/
RUN python3 -c "import tomllib; p = tomllib.load(open('/src/pyproject.toml', 'rb'))['project']; \
open('/src/operator.txt', 'w').write('\n'.join(p['dependencies']) + '\n'); \
open('/src/jobs.txt', 'w').write('\n'.join(p['optional-dependencies']['jobs']) + '\n')"

FROM python AS venv
ARG PIP_CERT
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=requirements /src/operator.txt /tmp/requirements/
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install -r /tmp/requirements/operator.txt

# The `jobs` extra on top: pyspark, pymongo, confluent-kafka.
FROM venv AS venv-jobs
ARG PIP_CERT
COPY --from=requirements /src/jobs.txt /tmp/requirements/
RUN /opt/venv/bin/pip install -r /tmp/requirements/jobs.txt

# ---- the operator itself, as a wheel ---------------------------------------------------------------
FROM python AS wheel
ARG PIP_CERT
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN python3 -m venv /tmp/build \
 && /tmp/build/bin/pip wheel --no-deps --wheel-dir /wheels .

# ---- spark-sql-kafka and its dependencies, minus what pyspark ships --------------------------------
FROM ${MAVEN_IMAGE} AS spark-kafka-jars
ARG MAVEN_OPTS
WORKDIR /build
COPY tools/spark-kafka/pom.xml ./
RUN mvn -B -q org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory=/jars

# ---- operator --------------------------------------------------------------------------------------
FROM python AS operator
COPY --from=venv /opt/venv /opt/venv
COPY --from=wheel /wheels /tmp/wheels
RUN /opt/venv/bin/pip install --no-cache-dir --no-deps --no-index /tmp/wheels/*.whl \
 && rm -rf /tmp/wheels
USER 10001:10001
WORKDIR /home/fibers
# kopf's liveness probe (/healthz) and metrics, as the chart configures them.
EXPOSE 8080
ENTRYPOINT ["fibers"]
CMD ["run"]

# ---- job -------------------------------------------------------------------------------------------
# Spark on Kubernetes starts this image with `driver …` or `executor` as arguments (see
# docker/job-entrypoint.sh); the DatabusConsumer pods run `fibers consume`. SPARK_HOME is the pyspark
# package in the virtualenv (the build fails here if the base's Python puts it elsewhere).
FROM python AS job
ARG JAVA_VERSION=17.0.*
ARG TINI_VERSION=0.19.*
ARG DEBIAN_FRONTEND=noninteractive
# openjdk's postinst links its man page into /usr/share/man/man1, which slim bases do not have.
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install -y --no-install-recommends "openjdk-17-jre-headless=${JAVA_VERSION}" "tini=${TINI_VERSION}" \
 && rm -rf /var/lib/apt/lists/*
COPY --from=venv-jobs /opt/venv /opt/venv
COPY --from=spark-kafka-jars /jars /opt/fibers/jars
COPY --chmod=0755 docker/job-entrypoint.sh /opt/fibers/entrypoint.sh
ENV SPARK_HOME=/opt/venv/lib/python3.11/site-packages/pyspark \
    PYSPARK_PYTHON=/opt/venv/bin/python \
    FIBERS_SPARK_KAFKA_JARS=/opt/fibers/jars
# The SparkApplication's mainApplicationFile is local:///opt/fibers/transform_job.py.
RUN test -x "$SPARK_HOME/bin/spark-submit" \
 && printf '%s\n' 'from fibers.jobs.transform import main' 'raise SystemExit(main())' \
      > /opt/fibers/transform_job.py
# Last, so that editing operator/ rebuilds only these small layers.
COPY --from=wheel /wheels /tmp/wheels
RUN /opt/venv/bin/pip install --no-cache-dir --no-deps --no-index /tmp/wheels/*.whl \
 && rm -rf /tmp/wheels
USER 10001:10001
WORKDIR /home/fibers
ENTRYPOINT ["/usr/bin/tini", "-s", "--", "/opt/fibers/entrypoint.sh"]
CMD ["--help"]
