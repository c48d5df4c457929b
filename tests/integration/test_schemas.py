"""Schema resources against the real kube-apiserver and the stack's real Apicurio registry (ccompat API)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.client import HTTPMessage
from typing import Any

import httpx
import pytest
from kubernetes import client
from kubernetes.client import ApiClient

from fibers_stack import StackInfo, apicurio, platform_resources
from tests.helpers import Resources, printed, wait_for
from tests.integration.conftest import OperatorProcess
from tests.integration.proxy import ForwardingProxy

pytestmark = pytest.mark.schemas


def avro(*fields: dict[str, Any], name: str = "Order") -> str:
    return json.dumps({"type": "record", "name": name, "namespace": "fibers.test", "fields": list(fields)})


ID = {"name": "id", "type": "long"}
ITEM = {"name": "item", "type": "string"}
QTY_DEFAULT = {"name": "qty", "type": "int", "default": 1}  # a new field with a default: BACKWARD-compatible
QTY_REQUIRED = {"name": "qty", "type": "int"}  # without one: not BACKWARD-compatible


@pytest.fixture(scope="module")
def operator_env(namespace: str) -> dict[str, str]:
    """The chart's setting: SchemaRegistry (and ConnectCluster) Secrets are read only in this namespace."""
    return {"FIBERS_CREDENTIAL_NAMESPACES": namespace}


@pytest.fixture(scope="module")
def schemas(kube: ApiClient, namespace: str, operator: OperatorProcess) -> Resources:
    return Resources(kube, "schemas", namespace)


@pytest.fixture(scope="module")
def registry(stack_info: StackInfo) -> Iterator[httpx.Client]:
    """The registry itself, to check what the operator did and to act as someone outside Fibers."""
    headers = {"Content-Type": "application/vnd.schemaregistry.v1+json"}
    with httpx.Client(base_url=stack_info.registry_url + "/apis/ccompat/v7", timeout=30, headers=headers) as http:
        yield http


def versions(registry: httpx.Client, subject: str) -> list[int]:
    reply = registry.get(f"/subjects/{subject}/versions")
    return sorted(reply.json()) if reply.status_code == 200 else []


def test_schema_registries_are_probed_and_carry_no_finalizer(
    kube: ApiClient, schema_registry: str, operator: OperatorProcess
) -> None:
    """The operator only watches a platform team's SchemaRegistry: one it cannot delete after an uninstall
    would be a trap (helm uninstall, then install, left the chart's registry deleted)."""
    custom = client.CustomObjectsApi(kube)

    def ready() -> dict[str, Any] | None:
        body: dict[str, Any] = custom.get_cluster_custom_object(
            "fibers.dev", "v1beta1", "schemaregistries", schema_registry
        )
        cond = next((c for c in (body.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"), {})
        return body if cond.get("status") == "True" else None

    body = wait_for(ready, timeout=60, what="SchemaRegistry Ready")
    assert not body["metadata"].get("finalizers")
    assert not any(k.startswith("kopf") for k in body["metadata"].get("annotations") or {})
    assert body["status"]["subjects"] >= 0 and body["status"]["compatibility"]
    row = printed(kube, "schemaregistries", None, schema_registry)
    assert (row["URL"], row["Ready"], row["Subjects"], row["Compatibility"]) == (
        body["spec"]["url"],
        "True",
        body["status"]["subjects"],
        body["status"]["compatibility"],
    )


def test_register_evolve_refuse_and_list(schemas: Resources, registry: httpx.Client, unique: str) -> None:
    subject = f"{unique}-value"
    schemas.create(unique, {"subject": subject, "schema": avro(ID, ITEM), "compatibility": "BACKWARD"})
    schemas.wait_condition(unique, "True", "Registered")
    first = schemas.status(unique)
    assert (first["subject"], first["version"], first["versions"], first["compatibility"]) == (
        subject,
        1,
        [1],
        "BACKWARD",
    )
    assert registry.get(f"/subjects/{subject}/versions/1").json()["id"] == first["id"]
    assert registry.get(f"/config/{subject}").json()["compatibilityLevel"] == "BACKWARD"
    row = schemas.printed(unique)
    assert (row["Subject"], row["Version"], row["ID"], row["Compatibility"], row["Ready"], row["Reason"]) == (
        subject,
        1,
        first["id"],
        "BACKWARD",
        "True",
        "Registered",
    )
    assert row["Registry"] == first["registry"] and row["Registry"]

    # A compatible change becomes version 2; version 1 stays.
    schemas.patch(unique, {"spec": {"schema": avro(ID, ITEM, QTY_DEFAULT)}})
    second = schemas.wait_status(unique, lambda s: s.get("version") == 2, what="version 2 registered")
    assert second["versions"] == [1, 2] and second["id"] != first["id"]
    assert second["registeredVersions"] == [1, 2]
    assert versions(registry, subject) == [1, 2]
    schemas.wait_event(unique, "Registered")

    # An incompatible change is refused with the registry's reason, and nothing is registered.
    schemas.patch(unique, {"spec": {"schema": avro(ID, ITEM, QTY_DEFAULT, {"name": "note", "type": "string"})}})
    refused = schemas.wait_condition(unique, "False", "Incompatible")
    assert "nothing was registered" in refused["message"] and "BACKWARD" in refused["message"]
    assert schemas.condition(unique, "Stalled")["status"] == "True"
    assert versions(registry, subject) == [1, 2]
    assert schemas.status(unique)["version"] == 2  # what is registered is still reported

    # Back to a compatible schema: Ready again, still two versions.
    schemas.patch(unique, {"spec": {"schema": avro(ID, ITEM, QTY_DEFAULT)}})
    schemas.wait_condition(unique, "True", "Registered")
    assert versions(registry, subject) == [1, 2]


def test_a_paused_schema_changes_nothing_in_the_registry_until_the_pause_ends(
    schemas: Resources, registry: httpx.Client, unique: str
) -> None:
    """fibers.dev/paused-reconciliation, as the README gives it for every kind: a Schema ignored it and
    registered whatever its spec said."""
    subject = f"{unique}-value"
    schemas.create(unique, {"subject": subject, "schema": avro(ID, ITEM)})
    schemas.wait_condition(unique, "True", "Registered")
    schemas.patch(unique, {"metadata": {"annotations": {"fibers.dev/paused-reconciliation": "true"}}})
    schemas.patch(unique, {"spec": {"schema": avro(ID, ITEM, QTY_DEFAULT)}})
    paused = schemas.wait_paused(unique)
    assert versions(registry, subject) == [1] and paused["version"] == 1  # looked at, and nothing registered
    schemas.patch(unique, {"metadata": {"annotations": {"fibers.dev/paused-reconciliation": None}}})
    schemas.wait_status(unique, lambda s: s.get("version") == 2, what="version 2 once the pause ended")
    assert versions(registry, subject) == [1, 2]


def test_retained_on_delete_by_default_and_soft_deleted_on_request(
    schemas: Resources, registry: httpx.Client, unique: str
) -> None:
    kept, dropped = f"{unique}-kept", f"{unique}-dropped"
    schemas.create(f"{unique}-a", {"subject": kept, "schema": avro(ID)})
    schemas.create(f"{unique}-b", {"subject": dropped, "schema": avro(ID), "deletionPolicy": "Delete"})
    schemas.wait_condition(f"{unique}-a", "True", "Registered")
    schemas.wait_condition(f"{unique}-b", "True", "Registered")
    schemas.delete(f"{unique}-a")
    schemas.delete(f"{unique}-b")
    wait_for(lambda: not schemas.exists(f"{unique}-a") and not schemas.exists(f"{unique}-b"), timeout=60, what="gone")
    assert versions(registry, kept) == [1]
    assert versions(registry, dropped) == []
    assert dropped in registry.get("/subjects", params={"deleted": "true"}).json()  # soft: still there, deleted


def test_subjects_registered_outside_fibers_are_left_alone(
    schemas: Resources, registry: httpx.Client, kube: ApiClient, stack_info: StackInfo, unique: str
) -> None:
    subject = f"{unique}-value"
    assert registry.post(f"/subjects/{subject}/versions", json={"schema": avro(ID)}).status_code == 200
    schemas.create(unique, {"subject": subject, "schema": avro(ID, QTY_DEFAULT), "deletionPolicy": "Delete"})
    cond = schemas.wait_condition(unique, "False", "SubjectExists")
    assert "spec.adopt" in cond["message"]
    assert versions(registry, subject) == [1]
    schemas.delete(unique)
    wait_for(lambda: not schemas.exists(unique), timeout=60, what="gone")
    assert versions(registry, subject) == [1]  # Delete never touches a subject it did not manage

    # spec.adopt is the namespace user's word: it takes over nothing unless the registry allows it.
    adopted = f"{unique}-adopt"
    schemas.create(adopted, {"subject": subject, "schema": avro(ID, QTY_DEFAULT), "adopt": True})
    cond = schemas.wait_condition(adopted, "False", "AdoptNotAllowed")
    assert "spec.allowAdopt" in cond["message"] and versions(registry, subject) == [1]
    consenting = f"{unique}-consenting"
    url = stack_info.registry_url + apicurio.CCOMPAT
    platform_resources.apply(kube, consenting, url, plural=platform_resources.SCHEMA_REGISTRIES, allowAdopt=True)
    schemas.delete(adopted)
    wait_for(lambda: not schemas.exists(adopted), timeout=60, what="gone")
    try:
        spec = {"subject": subject, "schema": avro(ID, QTY_DEFAULT), "adopt": True, "registry": consenting}
        schemas.create(adopted, spec)
        schemas.wait_condition(adopted, "True", "Registered")
        assert versions(registry, subject) == [1, 2]
    finally:
        platform_resources.delete(kube, consenting, plural=platform_resources.SCHEMA_REGISTRIES)


def test_a_subject_belongs_to_one_resource(
    schemas: Resources, registry: httpx.Client, kube: ApiClient, stack_info: StackInfo, unique: str
) -> None:
    subject = f"{unique}-value"
    schemas.create(f"{unique}-first", {"subject": subject, "schema": avro(ID)})
    schemas.wait_condition(f"{unique}-first", "True", "Registered")
    schemas.create(f"{unique}-second", {"subject": subject, "schema": avro(ID, QTY_DEFAULT)})
    cond = schemas.wait_condition(f"{unique}-second", "False", "SubjectOwned")
    assert f"{schemas.namespace}/{unique}-first" in cond["message"]
    assert versions(registry, subject) == [1]

    # The same registry declared a second time (one SchemaRegistry per team, this one allowing adopt): a
    # Schema through it is still refused a subject a Schema through the first holds.
    again = f"{unique}-again"
    url = stack_info.registry_url + apicurio.CCOMPAT
    platform_resources.apply(kube, again, url, plural=platform_resources.SCHEMA_REGISTRIES, allowAdopt=True)
    try:
        spec = {"subject": subject, "schema": avro(ID, QTY_DEFAULT), "adopt": True, "registry": again}
        schemas.create(f"{unique}-third", spec)
        cond = schemas.wait_condition(f"{unique}-third", "False", "SubjectOwned")
        assert f"{schemas.namespace}/{unique}-first" in cond["message"]
        assert versions(registry, subject) == [1]
    finally:
        platform_resources.delete(kube, again, plural=platform_resources.SCHEMA_REGISTRIES)


def test_a_look_that_cannot_choose_its_registry_keeps_what_the_schema_recorded(
    schemas: Resources, registry: httpx.Client, unique: str
) -> None:
    """Its registry named wrongly for a moment (a typo, a SchemaRegistry replaced by a sync): the status was
    written without `managed`, and once the name was right again the subject looked registered outside
    Fibers for good (SubjectExists), its next version never registered and deletionPolicy Delete skipped."""
    subject, name = f"{unique}-value", f"{unique}-kept"
    schemas.create(name, {"subject": subject, "schema": avro(ID)})
    schemas.wait_condition(name, "True", "Registered")
    schemas.patch(name, {"spec": {"registry": f"{unique}-missing"}})
    schemas.wait_condition(name, "False", "RegistryNotFound")
    assert schemas.status(name).get("managed") is True
    schemas.patch(name, {"spec": {"registry": None, "schema": avro(ID, QTY_DEFAULT)}})
    schemas.wait_status(name, lambda s: s.get("registeredVersions") == [1, 2], timeout=60, what="version 2")
    assert versions(registry, subject) == [1, 2]
    schemas.delete(name)


def test_a_subject_is_managed_on_the_server_it_was_registered_on_whatever_its_registry_is_called(
    schemas: Resources, registry: httpx.Client, kube: ApiClient, stack_info: StackInfo, unique: str
) -> None:
    """A SchemaRegistry's url changed (a migration, an edit): the Schemas through it found `managed` by the
    SchemaRegistry's name and took the subject at the new url for theirs whatever it held — registered over
    it and, with deletionPolicy Delete, deleted it, though another team may keep it there. Apicurio's older
    API path stands in for a second server: a new url to the operator, over the same store."""
    subject, name, moving = f"{unique}-value", f"{unique}-moved", f"{unique}-moving"
    v7, v6 = stack_info.registry_url + apicurio.CCOMPAT, stack_info.registry_url + "/apis/ccompat/v6"
    platform_resources.apply(kube, moving, v7, plural=platform_resources.SCHEMA_REGISTRIES)
    try:
        schemas.create(name, {"subject": subject, "schema": avro(ID), "registry": moving, "deletionPolicy": "Delete"})
        schemas.wait_condition(name, "True", "Registered")
        assert schemas.status(name)["registryUrl"] == v7
        # A new url where the subject holds what this resource registered: the same store, still its own.
        platform_resources.apply(kube, moving, v6, plural=platform_resources.SCHEMA_REGISTRIES)
        schemas.wait_status(name, lambda s: s.get("registryUrl") == v6, timeout=60, what="managed at the new url")
        assert schemas.condition(name)["reason"] == "Registered"

        # A new url where the subject holds something else: not this resource's (paused while it is staged).
        schemas.patch(name, {"metadata": {"annotations": {"fibers.dev/paused-reconciliation": "true"}}})
        schemas.wait_paused(name)
        assert registry.delete(f"/subjects/{subject}").status_code == 200
        assert registry.delete(f"/subjects/{subject}", params={"permanent": "true"}).status_code == 200
        assert (
            registry.post(f"/subjects/{subject}/versions", json={"schema": avro(ID, name="Other")}).status_code == 200
        )
        theirs = versions(registry, subject)
        platform_resources.apply(kube, moving, v7, plural=platform_resources.SCHEMA_REGISTRIES)
        schemas.patch(name, {"metadata": {"annotations": {"fibers.dev/paused-reconciliation": None}}})
        cond = schemas.wait_condition(name, "False", "SubjectExists")
        assert f"managed the subject on {v6}" in cond["message"]
        assert versions(registry, subject) == theirs
        schemas.delete(name)
        wait_for(lambda: not schemas.exists(name), timeout=60, what="gone")
        assert versions(registry, subject) == theirs  # not deleted through the new url
    finally:
        platform_resources.delete(kube, moving, plural=platform_resources.SCHEMA_REGISTRIES)


def test_drift_is_reported(schemas: Resources, registry: httpx.Client, unique: str) -> None:
    subject = f"{unique}-value"
    schemas.create(unique, {"subject": subject, "schema": avro(ID), "compatibility": "NONE"})
    schemas.wait_condition(unique, "True", "Registered")
    assert registry.post(f"/subjects/{subject}/versions", json={"schema": avro(ITEM)}).status_code == 200
    cond = schemas.wait_condition(unique, "False", "Drifted", timeout=30)
    assert "latest version" in cond["message"] and "is 2" in cond["message"]


@pytest.mark.parametrize(
    ("schema_type", "text"),
    [
        ("JSON", json.dumps({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]})),
        ("PROTOBUF", 'syntax = "proto3";\npackage fibers.test;\nmessage Order {\n  int64 id = 1;\n}\n'),
    ],
)
def test_json_schema_and_protobuf_subjects(
    schemas: Resources, registry: httpx.Client, unique: str, schema_type: str, text: str
) -> None:
    subject = f"{unique}-value"
    schemas.create(unique, {"subject": subject, "schemaType": schema_type, "schema": text})
    schemas.wait_condition(unique, "True", "Registered")
    latest = registry.get(f"/subjects/{subject}/versions/latest").json()
    assert latest["id"] == schemas.status(unique)["id"] and latest.get("schemaType") == schema_type


class AuthProxy(ForwardingProxy):
    """The stack's Apicurio behind a bearer token, as a registry with authentication is deployed: requests
    without the token get the Confluent API's 401 (error 40101) and never reach the registry."""

    content_type = "application/vnd.schemaregistry.v1+json"

    def __init__(self, upstream: str, token: str) -> None:
        self.refused = 0
        self.passed = 0
        self.token = token  # the one it takes: a rotation changes it
        super().__init__(upstream)

    def intercept(self, method: str, path: str, headers: HTTPMessage) -> tuple[int, bytes] | None:
        if headers.get("Authorization") != f"Bearer {self.token}":
            self.refused += 1
            return 401, b'{"error_code": 40101, "message": "Unauthorized"}'
        self.passed += 1
        return None


def test_a_registry_with_authentication_is_used_with_its_secret_which_is_read_only_where_allowed(
    schemas: Resources, registry: httpx.Client, kube: ApiClient, stack_info: StackInfo, namespace: str, unique: str
) -> None:
    """SchemaRegistry `auth` as ConnectCluster's: the operator's calls carry the Secret's bearer token; a
    Secret outside the credential namespaces (here, the team's own in `default`) is never read, and the
    registry and the Schemas using it say why."""
    core, token = client.CoreV1Api(kube), f"token-{unique}"
    proxy = AuthProxy(stack_info.registry_url, token)
    allowed, elsewhere = f"{unique}-auth", f"{unique}-elsewhere"
    for where in (namespace, "default"):
        secret = client.V1Secret(metadata=client.V1ObjectMeta(name=allowed), string_data={"token": token})
        core.create_namespaced_secret(where, secret)
    url = proxy.url + apicurio.CCOMPAT
    for name, where in ((allowed, namespace), (elsewhere, "default")):
        auth = {"bearer": {"secretRef": {"namespace": where, "name": allowed}}}
        platform_resources.apply(kube, name, url, plural=platform_resources.SCHEMA_REGISTRIES, auth=auth)
    try:
        subject = f"{unique}-value"
        schemas.create(unique, {"subject": subject, "schema": avro(ID), "registry": allowed})
        schemas.wait_condition(unique, "True", "Registered")
        assert versions(registry, subject) == [1] and proxy.passed > 0 and proxy.refused == 0

        refused = f"{unique}-refused"
        schemas.create(refused, {"subject": f"{refused}-value", "schema": avro(ID), "registry": elsewhere})
        cond = schemas.wait_condition(refused, "False", "RegistryCredentials")
        assert f"Secret default/{allowed}" in cond["message"] and "credentialNamespaces" in cond["message"]
        assert token not in json.dumps(schemas.get(refused))
        assert versions(registry, f"{refused}-value") == [] and proxy.refused == 0

        custom = client.CustomObjectsApi(kube)

        def registry_says() -> dict[str, Any] | None:
            body = custom.get_cluster_custom_object("fibers.dev", "v1beta1", "schemaregistries", elsewhere)
            conds = (body.get("status") or {}).get("conditions") or []
            return next((c for c in conds if c["type"] == "Ready" and c["reason"] == "CredentialsUnavailable"), None)

        assert (
            f"Secret default/{allowed}" in wait_for(registry_says, timeout=60, what="CredentialsUnavailable")["message"]
        )

        # The token rotated: the registry takes only the new one, the Secret gets it, and the operator's
        # next calls carry it (the Secret is read again on its change; no spec changed).
        proxy.token = f"rotated-{unique}"
        core.patch_namespaced_secret(allowed, namespace, {"stringData": {"token": proxy.token}})
        rotated = f"{unique}-rotated"
        schemas.create(rotated, {"subject": f"{rotated}-value", "schema": avro(ID), "registry": allowed})
        schemas.wait_condition(rotated, "True", "Registered", timeout=60)
        assert versions(registry, f"{rotated}-value") == [1]
        assert proxy.token not in json.dumps(schemas.get(rotated))
    finally:
        for name in (allowed, elsewhere):
            platform_resources.delete(kube, name, plural=platform_resources.SCHEMA_REGISTRIES)
        core.delete_namespaced_secret(allowed, "default")
        proxy.close()


class LosingProxy(ForwardingProxy):
    """The stack's Apicurio behind a gateway that loses the registry's answer to the first register call
    (its own 502, as when it times out while the registry writes): the version is stored, unheard of."""

    def __init__(self, upstream: str) -> None:
        self.lost = 0
        super().__init__(upstream)

    def answered(self, method: str, path: str, status: int, content: bytes) -> tuple[int, bytes]:
        if method == "POST" and path.endswith("/versions") and not self.lost:
            self.lost += 1
            return 502, b"<html><body>502 Bad Gateway</body></html>"
        return status, content


def test_a_first_registration_whose_answer_was_lost_stays_the_schemas(
    schemas: Resources, registry: httpx.Client, kube: ApiClient, stack_info: StackInfo, unique: str
) -> None:
    """The status said `managed` only once the register call was answered: its answer lost, the next look
    found the subject with a version "registered outside Fibers" (SubjectExists) for good, and deletionPolicy
    Delete left the subject behind. `status.registering`, written before the call, tells it apart."""
    proxy = LosingProxy(stack_info.registry_url)
    lossy, subject = f"{unique}-lossy", f"{unique}-value"
    platform_resources.apply(kube, lossy, proxy.url + apicurio.CCOMPAT, plural=platform_resources.SCHEMA_REGISTRIES)
    try:
        spec = {"subject": subject, "schema": avro(ID), "registry": lossy, "deletionPolicy": "Delete"}
        schemas.create(unique, spec)
        schemas.wait_condition(unique, "True", "Registered", timeout=90)
        status = schemas.status(unique)
        assert proxy.lost == 1 and versions(registry, subject) == [1]
        assert status["managed"] is True and status["registeredVersions"] == [1] and "registering" not in status
        schemas.delete(unique)
        wait_for(lambda: not schemas.exists(unique), timeout=60, what="gone")
        assert versions(registry, subject) == []
    finally:
        platform_resources.delete(kube, lossy, plural=platform_resources.SCHEMA_REGISTRIES)
        proxy.close()
