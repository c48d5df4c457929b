{{/* Names, labels and the RBAC rules shared by both watch modes. */}}

{{- define "fibers.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "fibers.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "fibers.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "fibers.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "fibers.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fibers.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "fibers.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "fibers.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: fibers
{{- end }}

{{- define "fibers.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "fibers.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
An image reference from {registry, repository, tag, digest}: the registry in front when set; with a
digest, repository:tag@digest (or repository@digest without a tag) — the digest decides what runs, the
tag stays for people; else repository:tag (empty: the chart's appVersion). Called with (list $root $image).
*/}}
{{- define "fibers.imageRef" -}}
{{- $root := index . 0 }}{{- $image := index . 1 }}
{{- $repository := include "fibers.imageRepository" $image }}
{{- if and $image.digest $image.tag }}
{{- printf "%s:%s@%s" $repository $image.tag $image.digest }}
{{- else if $image.digest }}
{{- printf "%s@%s" $repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (default $root.Chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}

{{- define "fibers.imageRepository" -}}
{{- if .registry }}{{ printf "%s/%s" (trimSuffix "/" .registry) .repository }}{{ else }}{{ .repository }}{{ end }}
{{- end }}

{{- define "fibers.image" -}}
{{- include "fibers.imageRef" (list . .Values.image) }}
{{- end }}

{{- define "fibers.jobImage" -}}
{{- include "fibers.imageRef" (list . .Values.jobs.image) }}
{{- end }}

{{/* Namespaces that get the job ServiceAccount: the watched ones, or (cluster-wide) the listed ones. */}}
{{- define "fibers.jobNamespaces" -}}
{{- if .Values.watch.namespaces }}
{{- toJson .Values.watch.namespaces }}
{{- else }}
{{- toJson (default (list .Release.Namespace) .Values.jobs.serviceAccount.namespaces) }}
{{- end }}
{{- end }}

{{/*
What the operator does on the Kubernetes API in the namespaces it watches, and nothing more.
Each rule names the code that needs it; tests/integration/test_chart.py runs the operator with
exactly these permissions.
*/}}
{{- define "fibers.operatorRules" -}}
# kopf lists and watches the three kinds and patches its progress annotations on Transforms and
# DatabusConsumers, and its finalizer on DatabusConsumers (it removes the one earlier versions put on
# Transforms); the Connect sync patches its own finalizer and claim annotation and reads a Connect
# before releasing it; the reconcilers read them (a Transform also reads the Connects named in its inputs).
# A Replay patches spec.seek of the Transforms and DatabusConsumers it moves back (fibers.replay).
- apiGroups: [fibers.dev]
  resources: [connects, transforms, databusconsumers, schemas, replays]
  verbs: [get, list, watch, patch]
# Observed state is written through the status subresource only (fibers.kube.Kube.replace_status).
- apiGroups: [fibers.dev]
  resources: [connects/status, transforms/status, databusconsumers/status, schemas/status, replays/status]
  verbs: [patch]
# SparkApplications and consumer Deployments carry an ownerReference with blockOwnerDeletion; where
# the OwnerReferencesPermissionEnforcement admission plugin is on (OpenShift), that needs this.
- apiGroups: [fibers.dev]
  resources: [transforms/finalizers, databusconsumers/finalizers]
  verbs: [update]
# Transform: one SparkApplication per run, created, listed by label, watched and deleted.
- apiGroups: [sparkoperator.k8s.io]
  resources: [sparkapplications]
  verbs: [list, watch, create, delete]
# Transform with spec.queue: Kueue's Workload of a queued run, read to say why it is not admitted yet.
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [list]
# Connect: values of spec.secretConfig come from the Secrets it names, read one key at a time. Secrets
# are also listed and watched, by their metadata only (no data is asked for, none is kept): a change to
# one a resource names reaches it (a connector's config written again, a consumer's pods rolled).
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, list, watch]
# Transform: a run's result ConfigMap is read, then deleted with the run.
# DatabusConsumer: the checkpoint ConfigMap is read to mirror it into status, and deleted on a
# seek or with the resource when checkpoint.retention is Delete (the consumers write it); the
# checkpoint ConfigMaps are listed and watched by their label (fibers.dev/databusconsumer), so a
# consumer's progress reaches its status without polling.
# Connect: `fibers.dev/offsets: list` writes the offsets ConfigMap (created, or replaced), and
# `alter` reads the one it names.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, update, delete]
# DatabusConsumer: one StatefulSet of its instances, read, created, patched (template, replicas) and
# deleted on a seek, and watched by label.
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get, list, watch, create, patch, delete]
# DatabusConsumer: a namespace's Leases are listed to find one named as a consumer's partition that
# its instances did not make (a Conflict; they never take it over). The instances hold their own.
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [list]
# DatabusConsumer: its pods are listed and watched by label to report an instance's exit (or ask a
# not-ready one why, on its metrics port) and to wait out a seek.
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
# Kubernetes Events on each resource, from kopf and from the reconcilers (core/v1 Events).
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end }}

{{/*
Cluster-scoped reads kopf makes in both modes: it discovers the CRDs of the kinds it serves and
watches them, so a CRD installed after the operator starts is picked up.
*/}}
{{- define "fibers.clusterReadRules" -}}
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
# ConnectClusters are cluster-scoped: watched, and probed into their status, in both modes.
- apiGroups: [fibers.dev]
  resources: [connectclusters]
  verbs: [get, list, watch]
- apiGroups: [fibers.dev]
  resources: [connectclusters/status]
  verbs: [patch]
# SchemaRegistries are cluster-scoped too: watched (Schemas, Avro inputs and consumers resolve them)
# and probed into their status; the operator never patches them (no finalizer, no annotations).
- apiGroups: [fibers.dev]
  resources: [schemaregistries]
  verbs: [get, list, watch]
- apiGroups: [fibers.dev]
  resources: [schemaregistries/status]
  verbs: [patch]
# Namespace labels decide which ConnectClusters a namespace may use (spec.namespaceSelector); with a
# fixed list of namespaces kopf also watches them, to notice a watched one created or deleted.
- apiGroups: [""]
  resources: [namespaces]
  verbs: [get, list, watch]
{{- end }}

{{/* The SchemaRegistry of Schemas without spec.registry: the chart's own when schemaRegistry.url is set. */}}
{{- define "fibers.schemaRegistryName" -}}
{{- .Values.schemaRegistry.name | default (include "fibers.fullname" .) -}}
{{- end }}
{{- define "fibers.defaultSchemaRegistry" -}}
{{- if .Values.schemaRegistry.default -}}
{{- .Values.schemaRegistry.default -}}
{{- else if .Values.schemaRegistry.url -}}
{{- include "fibers.schemaRegistryName" . -}}
{{- end -}}
{{- end }}

{{/* The ConnectCluster of Connects without spec.cluster: the chart's own when connect.url is set. */}}
{{- define "fibers.connectClusterName" -}}
{{- .Values.connect.clusterName | default (include "fibers.fullname" .) -}}
{{- end }}
{{- define "fibers.defaultConnectCluster" -}}
{{- if .Values.connect.defaultCluster -}}
{{- .Values.connect.defaultCluster -}}
{{- else if .Values.connect.url -}}
{{- include "fibers.connectClusterName" . -}}
{{- end -}}
{{- end }}

{{/*
What job pods do with the job ServiceAccount (Spark executors run as it too, without its token).
DatabusConsumer pods keep their checkpoint ConfigMap (read, create, compare-and-swap replace), read
their StatefulSet's replicas (how many instances share the partitions), and hold one Lease per
partition they consume (read, create, renew and release by replace).
A Transform's Spark driver (Spark 4.0 on Kubernetes, read from its fabric8 calls) writes the run's
result ConfigMap (create, or replace when it exists); creates, watches, lists and deletes its executor
pods, and labels them (get + patch) when they are kept; creates the ConfigMap it hands them; lists the
PersistentVolumeClaims it could reuse; and on exit deletes its executors, their ConfigMap, its Service
(created by spark-submit, not by the driver) and its claims by label: one deletecollection call, or a
list and one delete each where that is refused.
*/}}
{{- define "fibers.consumerRules" -}}
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get]
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, create, update]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, update]
{{- end }}

{{- define "fibers.jobRules" -}}
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, patch, delete, deletecollection]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, create, update, delete, deletecollection]
- apiGroups: [""]
  resources: [services]
  verbs: [list, delete, deletecollection]
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [list, delete, deletecollection]
{{- end }}
