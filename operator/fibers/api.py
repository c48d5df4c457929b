"""Names shared by the CRDs, the operator and the tests."""

from __future__ import annotations

GROUP = "fibers.dev"
VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"
# The kinds know nothing of each other (an import-linter contract says so); a Transform reads the
# Connect it names through the API, by this plural.
CONNECT_PLURAL = "connects"
SCHEMA_PLURAL = "schemas"  # a Transform's Avro input may name a Schema (schemaRef)
TRANSFORM_PLURAL = "transforms"  # a Transform input or a consumer source may name a Transform (transformRef)
DATABUS_PLURAL = "databusconsumers"
# Groups resources into one named pipeline (`fibers pipeline NAME`, `kubectl get fibers -l fibers.dev/pipeline=NAME`).
LABEL_PIPELINE = "fibers.dev/pipeline"

# kopf's, on DatabusConsumers (its deletion handler needs one). Transforms have none since their end needs
# no operator; kopf removes the one earlier versions put on them (see fibers.transform.handlers).
FINALIZER = "fibers.dev/finalizer"
# Connect manages its own: the finalizer and the claim on the connector name arrive in one patch,
# written just before the connector is created (see fibers.connect.sync).
CONNECT_FINALIZER = "fibers.dev/delete-connector"
ANNOTATION_OWNED_CONNECTOR = "fibers.dev/owned-connector"
ANNOTATION_CONNECT_CLUSTER = "fibers.dev/connect-cluster"  # the ConnectCluster the claimed connector lives on
ANNOTATION_PAUSED = "fibers.dev/paused-reconciliation"
ANNOTATION_RESTART = "fibers.dev/restart"
ANNOTATION_OFFSETS = "fibers.dev/offsets"  # list | reset | alter (see fibers.connect.offsets)
ANNOTATION_OFFSETS_FROM = "fibers.dev/offsets-from"  # the ConfigMap `alter` reads
# "orphan": a Connect being deleted leaves its connector running (see fibers.connect.deletion).
ANNOTATION_DELETION_POLICY = "fibers.dev/deletion-policy"


def object_ref(kind: str, namespace: str, name: str, uid: str) -> dict[str, object]:
    """The minimal body kopf needs to post an Event about a resource."""
    return {"apiVersion": API_VERSION, "kind": kind, "metadata": {"namespace": namespace, "name": name, "uid": uid}}
