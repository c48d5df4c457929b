#!/bin/bash
# The job image's entry point, started by tini (PID 1). Three ways in:
#
#   driver ARGS…   Spark on Kubernetes starting a driver container (the Spark Operator submits in
#                  cluster mode): run spark-submit in client mode inside this pod, bound to the pod's
#                  address, with the arguments Spark gave (--properties-file, --class, the app, its args).
#   executor       Spark's executor backend for Kubernetes; the driver describes the executor in SPARK_*
#                  environment variables on the pod (driver URL, id, cores, memory, JVM options, …).
#   anything else  the `fibers` command line: `consume …` (DatabusConsumer pods), `--help`, ….
#
# Nothing here writes to disk, so a read-only root filesystem works; PySpark itself needs /tmp writable
# (give the pod an emptyDir there), and Spark 4.0.0 creates `artifacts/` in the working directory, so a
# Spark process whose working directory is read-only starts in $TMPDIR (or /tmp) instead.
set -euo pipefail

: "${SPARK_HOME:?SPARK_HOME must point at the pyspark package (the image sets it)}"

writable_cwd() {
  [[ -w . ]] || cd "${TMPDIR:-/tmp}"
}

# Join the non-empty arguments with ':' (a Java class path).
join_path() {
  local joined="" part
  for part in "$@"; do
    [[ -n $part ]] && joined="${joined:+$joined:}$part"
  done
  printf '%s' "$joined"
}

case "${1:-}" in
  driver)
    shift
    writable_cwd
    exec "$SPARK_HOME/bin/spark-submit" \
      --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS:?Spark sets it on driver pods}" \
      --deploy-mode client \
      "$@"
    ;;
  executor)
    shift
    writable_cwd
    # SPARK_JAVA_OPT_0, _1, … in index order (the order Spark wrote them in).
    java_opts=()
    while IFS= read -r name; do
      java_opts+=("${!name}")
    done < <(compgen -A variable SPARK_JAVA_OPT_ | sort -t _ -k 4 -n)
    # Spark's configuration first (log4j2 settings), then Hadoop's, the pod's own entries and Spark's jars.
    classpath=$(join_path "${SPARK_CONF_DIR:-$SPARK_HOME/conf}" "${HADOOP_CONF_DIR:-}" "${SPARK_CLASSPATH:-}" \
      "$SPARK_HOME/jars/*" "${SPARK_EXTRA_CLASSPATH:-}" "${SPARK_DIST_CLASSPATH:-}")
    exec "${JAVA_HOME:+$JAVA_HOME/bin/}java" \
      "${java_opts[@]}" \
      "-Xms${SPARK_EXECUTOR_MEMORY:?}" "-Xmx${SPARK_EXECUTOR_MEMORY}" \
      -cp "$classpath" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "${SPARK_DRIVER_URL:?}" \
      --executor-id "${SPARK_EXECUTOR_ID:?}" \
      --cores "${SPARK_EXECUTOR_CORES:?}" \
      --app-id "${SPARK_APPLICATION_ID:?}" \
      --hostname "${SPARK_EXECUTOR_POD_IP:?}" \
      --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
      --podName "${SPARK_EXECUTOR_POD_NAME:-$HOSTNAME}"
    ;;
  *)
    exec fibers "$@"
    ;;
esac
