"""What a namespace user may ask of the pods the operator creates for them (pure: no I/O).

Creating a DatabusConsumer or a Transform makes the operator create pods, with its own permissions:
without a policy, whoever may edit those resources could run any image, under any ServiceAccount of
their namespace, with the node's filesystem mounted (hostPath), or steer spark-submit with its own
settings (another namespace, ServiceAccount, image or pod template). The platform team sets the
policy in chart values (`policy.*`); it is checked before anything is created, and a refusal is the
resource's condition, naming the field. An operator run by hand, without the chart, has no list of
images or ServiceAccounts (anything goes) and refuses hostPath all the same.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

IMAGES_ENV = "FIBERS_ALLOWED_IMAGES"  # comma-separated image prefixes (chart: policy.allowedImages)
SERVICE_ACCOUNTS_ENV = "FIBERS_ALLOWED_SERVICE_ACCOUNTS"  # comma-separated names (chart: policy.allowedServiceAccounts)
HOST_PATH_ENV = "FIBERS_ALLOW_HOST_PATH"  # "true" lets spec volumes be hostPath (chart: policy.allowHostPath)

# Spark settings a Transform's sparkConf may not pass on: they would move the job to another namespace,
# ServiceAccount, image or pod template, mount volumes of the submitter's choosing, or change how it is
# submitted; the spec has its own fields, which the policy checks, for what is allowed of these. The
# Kerberos files are read by spark-submit where it runs — in the Spark Operator's pod — and written into a
# ConfigMap or Secret of the job's namespace: `krb5.path` naming the Spark Operator's own token file would
# hand that token to whoever reads the namespace.
FORBIDDEN_SPARK_CONF = (
    "spark.kubernetes.namespace",
    "spark.kubernetes.authenticate.",
    "spark.kubernetes.container.image",
    "spark.kubernetes.driver.container.image",
    "spark.kubernetes.executor.container.image",
    "spark.kubernetes.driver.podTemplate",
    "spark.kubernetes.executor.podTemplate",
    "spark.kubernetes.driver.volumes.",
    "spark.kubernetes.executor.volumes.",
    "spark.kubernetes.driver.pod.name",
    "spark.kubernetes.driver.master",
    "spark.kubernetes.file.upload.path",
    "spark.kubernetes.kerberos.",
    "spark.kerberos.",
    "spark.master",
    "spark.submit.",
)

# Volume types a spec may mount: those of Pod Security's `restricted` profile, which hold nothing outside
# the namespace. Any other (nfs, iscsi, rbd, cephfs, gitRepo, flexVolume, …) reaches storage shared beyond
# it — another team's exports — and hostPath the node; hostPath only where the chart allows it.
VOLUME_TYPES = frozenset(
    {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
)
IMAGE_BOUNDARIES = "/:@"  # where an image prefix without its own separator must end in the image


def _image_allowed(image: str, prefix: str) -> bool:
    """`registry.corp.io` allows `registry.corp.io/x:1`, not `registry.corp.io.evil.com/x:1`: a prefix
    that does not end at a separator must end at one in the image."""
    if not image.startswith(prefix):
        return False
    return prefix[-1:] in IMAGE_BOUNDARIES or len(image) == len(prefix) or image[len(prefix)] in IMAGE_BOUNDARIES


def _forbidden_in(value: Any) -> str:
    """A forbidden setting passed as a JVM system property inside another setting's value
    (`spark.driver.extraJavaOptions: -Dspark.kubernetes.executor.volumes…`, an env var's JAVA_TOOL_OPTIONS):
    the driver reads `spark.*` properties as settings. "" when none is."""
    text = str(value)
    for key in FORBIDDEN_SPARK_CONF:
        if f"-D{key}" in text:
            return key
    return ""


def _listed(value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    return tuple(item.strip() for item in value.split(",") if item.strip())


@dataclass(frozen=True)
class PodPolicy:
    images: tuple[str, ...] | None = None  # allowed image prefixes; None: any image
    service_accounts: tuple[str, ...] | None = None  # allowed ServiceAccount names; None: any
    host_path: bool = False  # whether spec volumes may be hostPath

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> PodPolicy:
        return cls(
            images=_listed(env.get(IMAGES_ENV)),
            service_accounts=_listed(env.get(SERVICE_ACCOUNTS_ENV)),
            host_path=env.get(HOST_PATH_ENV, "").strip().lower() == "true",
        )

    def problems(
        self,
        *,
        image: tuple[str, str | None] = ("", None),
        service_account: tuple[str, str | None] = ("", None),
        volumes: tuple[str, Iterable[Mapping[str, Any]]] = ("", ()),
        spark_conf: tuple[str, Mapping[str, Any]] = ("", {}),
    ) -> list[str]:
        """What the spec asks that the policy does not allow, each naming its field. Each argument is
        (the field's path, what the spec sets there; None or empty: the operator's default, allowed)."""
        found = []
        field, value = image
        if value and self.images is not None and not any(_image_allowed(value, p) for p in self.images):
            allowed = ", ".join(self.images) or "none"
            found.append(
                f"{field}: image {value} is not allowed (allowed prefixes: {allowed}; chart policy.allowedImages)"
            )
        field, value = service_account
        if value and self.service_accounts is not None and value not in self.service_accounts:
            allowed = ", ".join(self.service_accounts) or "none"
            found.append(
                f"{field}: ServiceAccount {value} is not allowed "
                f"(allowed: {allowed}; chart policy.allowedServiceAccounts)"
            )
        field, listed = volumes
        for index, volume in enumerate(listed):
            for kind in sorted(set(volume) - {"name"} - VOLUME_TYPES):
                if kind != "hostPath":
                    allowed = ", ".join(sorted(VOLUME_TYPES))
                    found.append(f"{field}[{index}].{kind}: {kind} volumes are not allowed (allowed: {allowed})")
                elif not self.host_path:
                    found.append(
                        f"{field}[{index}].hostPath: hostPath volumes are not allowed (chart policy.allowHostPath)"
                    )
        field, conf = spark_conf
        for key in sorted(conf):
            if key.startswith(FORBIDDEN_SPARK_CONF):
                found.append(f"{field}.{key}: this Spark setting is set by the operator, not by a Transform")
            elif inner := _forbidden_in(conf[key]):
                found.append(f"{field}.{key}: sets {inner}… as a JVM property, which a Transform may not set")
        return found


# No lists (any image, any ServiceAccount) and no hostPath: an operator run by hand, without the chart.
OPEN = PodPolicy()
