{{/*
Names and labels of every resource: defined here only, so that templates never spell one.
*/}}

{{- define "persistent-pipelines.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The prefix of every resource name (at most 45 characters, room for the suffixes). */}}
{{- define "persistent-pipelines.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 45 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 45 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 45 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "persistent-pipelines.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every resource. */}}
{{- define "persistent-pipelines.labels" -}}
helm.sh/chart: {{ include "persistent-pipelines.chart" . }}
app.kubernetes.io/name: {{ include "persistent-pipelines.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: persistent-pipelines
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* ---- the operator ---- */}}

{{- define "persistent-pipelines.operator.name" -}}
{{- include "persistent-pipelines.fullname" . }}-operator
{{- end }}

{{- define "persistent-pipelines.operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "persistent-pipelines.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "persistent-pipelines.operator.labels" -}}
{{ include "persistent-pipelines.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "persistent-pipelines.operator.image" -}}
{{- $image := .Values.operator.image }}
{{- if $image.registry }}
{{- printf "%s/%s:%s" $image.registry $image.repository (default .Chart.AppVersion $image.tag) }}
{{- else }}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}

{{- define "persistent-pipelines.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "persistent-pipelines.operator.name" .) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Cluster-scoped needs: kopf's scan of CRDs, namespaces (all-namespaces mode), peering. */}}
{{- define "persistent-pipelines.operator.clusterRoleName" -}}
{{- include "persistent-pipelines.operator.name" . }}
{{- end }}

{{/* What the operator does in a namespace it serves (bound cluster-wide or per namespace). */}}
{{- define "persistent-pipelines.operator.pipelinesRoleName" -}}
{{- include "persistent-pipelines.operator.name" . }}-pipelines
{{- end }}

{{- define "persistent-pipelines.operator.metricsServiceName" -}}
{{- include "persistent-pipelines.operator.name" . }}-metrics
{{- end }}

{{/* True (non-empty) when the operator runs several replicas under kopf peering. */}}
{{- define "persistent-pipelines.operator.peered" -}}
{{- if gt (int .Values.operator.replicas) 1 }}true{{ end }}
{{- end }}

{{/* ---- the drivers ---- */}}

{{/*
The job namespaces as a JSON list of {name, kubernetesExecutors, serviceAccountAnnotations}:
an entry of driver.jobNamespaces is a name (the drivers' defaults apply) or an object.
*/}}
{{- define "persistent-pipelines.jobNamespaces" -}}
{{- $all := list }}
{{- range .Values.driver.jobNamespaces }}
{{- $entry := kindIs "string" . | ternary (dict "name" .) . }}
{{- $executors := hasKey $entry "kubernetesExecutors" | ternary $entry.kubernetesExecutors $.Values.driver.rbac.kubernetesExecutors }}
{{- $annotations := merge (deepCopy ($entry.serviceAccountAnnotations | default dict)) $.Values.driver.serviceAccount.annotations }}
{{- $all = append $all (dict "name" $entry.name "kubernetesExecutors" $executors "serviceAccountAnnotations" $annotations) }}
{{- end }}
{{- toJson $all }}
{{- end }}

{{/* The names of the job namespaces, as a JSON list. */}}
{{- define "persistent-pipelines.jobNamespaceNames" -}}
{{- $names := list }}
{{- range include "persistent-pipelines.jobNamespaces" . | fromJsonArray }}
{{- $names = append $names .name }}
{{- end }}
{{- toJson $names }}
{{- end }}

{{- define "persistent-pipelines.driver.serviceAccountName" -}}
{{- .Values.driver.serviceAccount.name }}
{{- end }}

{{- define "persistent-pipelines.driver.roleName" -}}
{{- include "persistent-pipelines.fullname" . }}-driver
{{- end }}

{{/* The operator's Role in each job namespace: the Secrets its pipelines name. */}}
{{- define "persistent-pipelines.operator.secretsRoleName" -}}
{{- include "persistent-pipelines.operator.name" . }}-secrets
{{- end }}

{{- define "persistent-pipelines.driver.labels" -}}
{{ include "persistent-pipelines.labels" . }}
app.kubernetes.io/component: driver
{{- end }}

{{/* ---- admission ---- */}}

{{- define "persistent-pipelines.admission.pipelinesName" -}}
{{- include "persistent-pipelines.fullname" . }}-pipelines
{{- end }}

{{- define "persistent-pipelines.admission.driverPodsName" -}}
{{- include "persistent-pipelines.fullname" . }}-driver-pods
{{- end }}

{{- define "persistent-pipelines.admission.labels" -}}
{{ include "persistent-pipelines.labels" . }}
app.kubernetes.io/component: admission
{{- end }}

{{/* The accounts a pipeline may name in spec.driver.serviceAccountName, as a CEL list. */}}
{{- define "persistent-pipelines.admission.driverAccounts" -}}
{{- $accounts := prepend .Values.admission.driverServiceAccounts (include "persistent-pipelines.driver.serviceAccountName" .) }}
{{- $quoted := list }}
{{- range $accounts | uniq }}
{{- $quoted = append $quoted (printf "'%s'" .) }}
{{- end }}
{{- printf "[%s]" (join ", " $quoted) }}
{{- end }}

{{/* Fails the render on combinations the schema cannot express. */}}
{{- define "persistent-pipelines.validate" -}}
{{- $watched := .Values.operator.watchNamespaces }}
{{- $names := include "persistent-pipelines.jobNamespaceNames" . | fromJsonArray }}
{{- if ne (len $names) (len ($names | uniq)) }}
{{- fail (printf "driver.jobNamespaces: a namespace is listed twice in %v" $names) }}
{{- end }}
{{- if $watched }}
{{- range $names }}
{{- if not (has . $watched) }}
{{- fail (printf "driver.jobNamespaces: %q is not in operator.watchNamespaces %v: no operator would serve its pipelines" . $watched) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and .Values.driver.rbac.create (not .Values.driver.jobNamespaces) }}
{{- fail "driver.jobNamespaces is empty: list the namespaces where pipelines run (their drivers need a ServiceAccount and Role there)" }}
{{- end }}
{{- end }}
