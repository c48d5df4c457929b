"""The pod policy: what a namespace user may ask of the pods Fibers creates for them."""

from __future__ import annotations

from fibers.podpolicy import OPEN, PodPolicy

CHART = PodPolicy.from_env(
    {
        "FIBERS_ALLOWED_IMAGES": "fibers-job:,registry.example.com/shop/",
        "FIBERS_ALLOWED_SERVICE_ACCOUNTS": "fibers-job",
        "FIBERS_ALLOW_HOST_PATH": "false",
    }
)


def fields(refused: list[str]) -> list[str]:
    """The field each refusal names (what comes before its first colon)."""
    return [r.split(":")[0] for r in refused]


def test_the_operators_defaults_are_always_allowed() -> None:
    assert CHART.problems(image=("spec.image", None), service_account=("spec.serviceAccount", None)) == []


def test_images_must_start_with_an_allowed_prefix() -> None:
    assert CHART.problems(image=("spec.image", "registry.example.com/shop/totals:1")) == []
    assert CHART.problems(image=("spec.image", "fibers-job:0.9")) == []
    [refused] = CHART.problems(image=("spec.spark.image", "fibers-job-evil:1"))
    assert refused.startswith("spec.spark.image: image fibers-job-evil:1 is not allowed")


def test_service_accounts_must_be_listed() -> None:
    assert CHART.problems(service_account=("spec.serviceAccount", "fibers-job")) == []
    [refused] = CHART.problems(service_account=("spec.serviceAccount", "default"))
    assert refused.startswith("spec.serviceAccount: ServiceAccount default is not allowed")


def test_host_path_volumes_are_refused_unless_allowed_and_named_by_index() -> None:
    volumes = [
        {"name": "data", "persistentVolumeClaim": {"claimName": "d"}},
        {"name": "node", "hostPath": {"path": "/"}},
    ]
    [refused] = CHART.problems(volumes=("spec.spark.volumes", volumes))
    assert refused.startswith("spec.spark.volumes[1].hostPath:")
    assert OPEN.problems(volumes=("spec.spark.volumes", volumes)) != []  # by hand, without the chart, too
    assert PodPolicy(host_path=True).problems(volumes=("spec.spark.volumes", volumes)) == []


def test_spark_settings_that_move_the_job_are_refused() -> None:
    conf = {
        "spark.sql.shuffle.partitions": "4",
        "spark.kubernetes.namespace": "kube-system",
        "spark.kubernetes.authenticate.driver.serviceAccountName": "admin",
        "spark.kubernetes.driver.podTemplateFile": "/x",
        "spark.kubernetes.executor.volumes.hostPath.root.mount.path": "/host",
    }
    refused = CHART.problems(spark_conf=("spec.spark.sparkConf", conf))
    assert fields(refused) == [
        "spec.spark.sparkConf.spark.kubernetes.authenticate.driver.serviceAccountName",
        "spec.spark.sparkConf.spark.kubernetes.driver.podTemplateFile",
        "spec.spark.sparkConf.spark.kubernetes.executor.volumes.hostPath.root.mount.path",
        "spec.spark.sparkConf.spark.kubernetes.namespace",
    ]


def test_without_the_chart_any_image_and_service_account_go() -> None:
    assert OPEN.problems(image=("spec.image", "anything:1"), service_account=("spec.serviceAccount", "any")) == []


def test_spark_settings_read_on_the_submitters_side_are_refused() -> None:
    """spark-submit runs in the Spark Operator's pod and copies the Kerberos files it names into the job's
    namespace: `krb5.path` set to the Spark Operator's token file handed that token to the namespace."""
    token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    conf = {"spark.kubernetes.kerberos.krb5.path": token, "spark.kerberos.keytab": token}
    refused = CHART.problems(spark_conf=("spec.spark.sparkConf", conf))
    assert fields(refused) == [
        "spec.spark.sparkConf.spark.kerberos.keytab",
        "spec.spark.sparkConf.spark.kubernetes.kerberos.krb5.path",
    ]


def test_a_refused_setting_passed_as_a_jvm_property_is_refused() -> None:
    """The driver reads `-Dspark.*` system properties as settings: the refused ones came in through
    extraJavaOptions or an environment variable of the driver."""
    conf = {
        "spark.driver.extraJavaOptions": "-XX:+UseG1GC -Dspark.kubernetes.executor.volumes.hostPath.r.mount.path=/h",
        "spark.kubernetes.driverEnv.JAVA_TOOL_OPTIONS": "-Dspark.kubernetes.executor.container.image=evil:1",
        "spark.executor.extraJavaOptions": "-XX:+UseG1GC -Dlog4j.configuration=file:/opt/log4j.properties",
    }
    refused = CHART.problems(spark_conf=("spec.spark.sparkConf", conf))
    assert fields(refused) == [
        "spec.spark.sparkConf.spark.driver.extraJavaOptions",
        "spec.spark.sparkConf.spark.kubernetes.driverEnv.JAVA_TOOL_OPTIONS",
    ]
    assert "spark.kubernetes.executor.volumes." in refused[0]


def test_only_volume_types_that_stay_in_the_namespace_are_allowed() -> None:
    """nfs, iscsi, cephfs, gitRepo… reach storage shared beyond the namespace (another team's exports):
    only hostPath was refused."""
    volumes = [
        {"name": "a", "emptyDir": {}},
        {"name": "b", "configMap": {"name": "c"}},
        {"name": "c", "nfs": {"server": "nfs.storage", "path": "/export"}},
        {"name": "d", "gitRepo": {"repository": "https://x"}},
    ]
    refused = PodPolicy(host_path=True).problems(volumes=("spec.spark.volumes", volumes))
    assert fields(refused) == ["spec.spark.volumes[2].nfs", "spec.spark.volumes[3].gitRepo"]


def test_an_image_prefix_ends_at_a_separator() -> None:
    """A prefix `registry.corp.io` let `registry.corp.io.evil.com/miner` through."""
    policy = PodPolicy(images=("registry.corp.io", "ghcr.io/acme/", "fibers-job:"))
    assert policy.problems(image=("spec.image", "registry.corp.io/team/x:1")) == []
    assert policy.problems(image=("spec.image", "ghcr.io/acme/totals:2")) == []
    [refused] = policy.problems(image=("spec.image", "registry.corp.io.evil.com/miner:1"))
    assert refused.startswith("spec.image: image registry.corp.io.evil.com/miner:1 is not allowed")
