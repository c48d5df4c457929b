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
    assert [r.split(":")[0] for r in refused] == [
        "spec.spark.sparkConf.spark.kubernetes.authenticate.driver.serviceAccountName",
        "spec.spark.sparkConf.spark.kubernetes.driver.podTemplateFile",
        "spec.spark.sparkConf.spark.kubernetes.executor.volumes.hostPath.root.mount.path",
        "spec.spark.sparkConf.spark.kubernetes.namespace",
    ]


def test_without_the_chart_any_image_and_service_account_go() -> None:
    assert OPEN.problems(image=("spec.image", "anything:1"), service_account=("spec.serviceAccount", "any")) == []
