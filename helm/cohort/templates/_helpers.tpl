{{/*
Names, labels and small computed values shared by the templates.
*/}}

{{- define "cohort.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name: <release> when it already contains the chart name, else <release>-cohort. */}}
{{- define "cohort.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* A cluster-scoped object's name: <namespace>-<fullname><suffix>, so that releases of the
same name in different namespaces (one per team, say) do not collide. Call with (list $ "-suffix"). */}}
{{- define "cohort.clusterName" -}}
{{- $root := index . 0 -}}
{{- $suffix := index . 1 -}}
{{- $prefix := printf "%s-%s" $root.Release.Namespace (include "cohort.fullname" $root) | trunc (int (sub 63 (len $suffix))) | trimSuffix "-" -}}
{{- printf "%s%s" $prefix $suffix -}}
{{- end -}}

{{- define "cohort.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object of the release. */}}
{{- define "cohort.labels" -}}
helm.sh/chart: {{ include "cohort.chart" . }}
app.kubernetes.io/name: {{ include "cohort.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: cohort
{{- end -}}

{{/* The operator pods' selector (also used by the metrics Service and the NetworkPolicy). */}}
{{- define "cohort.operatorSelectorLabels" -}}
app.kubernetes.io/name: {{ include "cohort.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "cohort.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "cohort.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* An image reference from {registry, repository, tag, digest}; call with (dict "image" ... "root" $),
adding "tagSuffix" for a default tag of <appVersion><suffix>. */}}
{{- define "cohort.imageRef" -}}
{{- $registry := .image.registry | default .root.Values.global.imageRegistry -}}
{{- $name := .image.repository -}}
{{- if $registry -}}{{- $name = printf "%s/%s" (trimSuffix "/" $registry) .image.repository -}}{{- end -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $name .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $name (.image.tag | default (printf "%s%s" .root.Chart.AppVersion (.tagSuffix | default "")) | toString) -}}
{{- end -}}
{{- end -}}

{{- define "cohort.operatorImage" -}}
{{- include "cohort.imageRef" (dict "image" .Values.image "root" .) -}}
{{- end -}}

{{- define "cohort.trainerImage" -}}
{{- include "cohort.imageRef" (dict "image" .Values.trainer.image "root" .) -}}
{{- end -}}

{{- define "cohort.trainerCudaImage" -}}
{{- include "cohort.imageRef" (dict "image" .Values.trainer.cudaImage "root" . "tagSuffix" "-cuda") -}}
{{- end -}}

{{/* "true" when the operator elects a leader with a Lease (replicas > 1, or forced). */}}
{{- define "cohort.leaderElection" -}}
{{- $le := .Values.operator.leaderElection.enabled -}}
{{- if kindIs "bool" $le -}}
{{- ternary "true" "" $le -}}
{{- else if gt (int .Values.operator.replicas) 1 -}}
true
{{- end -}}
{{- end -}}

{{- define "cohort.leaseName" -}}
{{- default (include "cohort.fullname" .) .Values.operator.leaderElection.leaseName -}}
{{- end -}}

{{/* Namespaces where jobs (and so workers) run, as a JSON list; empty means every namespace. */}}
{{- define "cohort.jobNamespaces" -}}
{{- toJson (uniq .Values.operator.watchNamespaces) -}}
{{- end -}}

{{/* A capability check for prometheus-operator kinds: (list $ "ServiceMonitor"). */}}
{{- define "cohort.hasMonitoringKind" -}}
{{- $root := index . 0 -}}
{{- if $root.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" (index . 1)) -}}
true
{{- end -}}
{{- end -}}

{{/*
The operator's permissions in a namespace where jobs run (a ClusterRole when it
watches every namespace). Each verb is one the operator (cohort.operator:
kubeapi/reconciler/events, and kopf's watches) actually calls:
- trainingjobs: list/watch (kopf), get (re-read after an error), delete (ttlSecondsAfterFinished);
  status: patch; finalizers: update (blockOwnerDeletion on owner references,
  where OwnerReferencesPermissionEnforcement is on);
- pods: list/watch, create, delete;
- configmaps: get, list/watch, create, patch (job config and world);
- services, serviceaccounts, roles, rolebindings, poddisruptionbudgets:
  list/watch (drift repair), create;
- events: create, patch (aggregated counts);
- networkpolicies: list/watch (drift repair), create: one per job, with networkPolicy.enabled.
Creating a worker Role that grants get/list/watch on a ConfigMap requires
holding those verbs (RBAC escalation check): configmaps has them.
*/}}
{{- define "cohort.jobRules" -}}
- apiGroups: [cohort.dev]
  resources: [trainingjobs]
  verbs: [get, list, watch, delete]
- apiGroups: [cohort.dev]
  resources: [trainingjobs/status]
  verbs: [patch]
- apiGroups: [cohort.dev]
  resources: [trainingjobs/finalizers]
  verbs: [update]
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch, create, delete]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, patch]
- apiGroups: [""]
  resources: [services, serviceaccounts]
  verbs: [list, watch, create]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [list, watch, create]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [list, watch, create]
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
{{- if .Values.networkPolicy.enabled }}
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [list, watch, create]
{{- end }}
{{- if .Values.rbac.kueue }}
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads/status]
  verbs: [patch]
{{- end }}
{{- if .Values.rbac.gangScheduling }}
- apiGroups: [scheduling.k8s.io]
  resources: [podgroups, workloads]
  verbs: [create]
- apiGroups: [scheduling.x-k8s.io, scheduling.volcano.sh]
  resources: [podgroups]
  verbs: [create]
{{- end }}
{{- end -}}
