{{/*
Chart name, truncated to the 63 characters a label value allows.
*/}}
{{- define "dra-claim-controller.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified object name prefix.
*/}}
{{- define "dra-claim-controller.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Value of the helm.sh/chart label.
*/}}
{{- define "dra-claim-controller.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels: stable for the lifetime of a release.
*/}}
{{- define "dra-claim-controller.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dra-claim-controller.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Standard labels for every object.
*/}}
{{- define "dra-claim-controller.labels" -}}
helm.sh/chart: {{ include "dra-claim-controller.chart" . }}
{{ include "dra-claim-controller.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: controller
app.kubernetes.io/part-of: dynamic-resource-allocation
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
ServiceAccount name.
*/}}
{{- define "dra-claim-controller.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "dra-claim-controller.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Container image reference: digest wins over tag; tag defaults to appVersion.
*/}}
{{- define "dra-claim-controller.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/*
Namespace of the leader-election Lease (and so of the lease Role).
*/}}
{{- define "dra-claim-controller.leaseNamespace" -}}
{{- .Values.leaderElection.resourceNamespace | default .Release.Namespace }}
{{- end }}

{{/*
Milliseconds in a Go duration made of integer h/m/s/ms parts ("1m30s",
"20s", "500ms"). The schema restricts values to that form; anything else
fails rendering here.
Usage: include "dra-claim-controller.durationMillis" (list "shutdownTimeout" .Values.shutdownTimeout)
*/}}
{{- define "dra-claim-controller.durationMillis" -}}
{{- $key := index . 0 }}
{{- $d := toString (index . 1) }}
{{- $re := "^(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?(?:([0-9]+)ms)?$" }}
{{- if or (eq $d "") (not (regexMatch $re $d)) }}
{{- fail (printf "%s: %q is not a duration such as 20s, 1m30s or 500ms" $key $d) }}
{{- end }}
{{- $h := regexReplaceAll $re $d "${1}" | default "0" | atoi }}
{{- $m := regexReplaceAll $re $d "${2}" | default "0" | atoi }}
{{- $s := regexReplaceAll $re $d "${3}" | default "0" | atoi }}
{{- $ms := regexReplaceAll $re $d "${4}" | default "0" | atoi }}
{{- add (mul $h 3600000) (mul $m 60000) (mul $s 1000) $ms }}
{{- end }}

{{/*
terminationGracePeriodSeconds: the shutdown bound, rounded up to whole
seconds, plus padding, so the kubelet's SIGKILL always comes after the
controller's own drain deadline.
*/}}
{{- define "dra-claim-controller.terminationGracePeriodSeconds" -}}
{{- $ms := include "dra-claim-controller.durationMillis" (list "shutdownTimeout" .Values.shutdownTimeout) | atoi }}
{{- $secs := div (add $ms 999) 1000 }}
{{- add $secs .Values.terminationGracePeriodPaddingSeconds }}
{{- end }}

{{/*
A number as a command-line value: integral values without an exponent or
decimal point (YAML numbers arrive as float64), others as they are.
*/}}
{{- define "dra-claim-controller.number" -}}
{{- $v := . }}
{{- if eq (float64 (int64 $v)) (float64 $v) }}
{{- int64 $v }}
{{- else }}
{{- $v }}
{{- end }}
{{- end }}

{{/*
host:port bind address.
*/}}
{{- define "dra-claim-controller.bindAddress" -}}
{{- $host := .bindHost | default "" }}
{{- if contains ":" $host }}
{{- printf "[%s]:%d" $host (int .port) }}
{{- else }}
{{- printf "%s:%d" $host (int .port) }}
{{- end }}
{{- end }}

{{/*
PromQL label matchers: the given ones (may be empty) plus the optional
prometheusRule.selector; nothing at all when both are empty.
Usage: include "dra-claim-controller.promMatchers" (list . `name="resource_claim"`)
*/}}
{{- define "dra-claim-controller.promMatchers" -}}
{{- $root := index . 0 }}
{{- $parts := list }}
{{- with index . 1 }}{{ $parts = append $parts . }}{{ end }}
{{- with $root.Values.prometheusRule.selector }}{{ $parts = append $parts . }}{{ end }}
{{- with $parts }}
{{- printf "{%s}" (join "," .) }}
{{- end }}
{{- end }}

{{/*
Checks across values that the JSON schema cannot express.
*/}}
{{- define "dra-claim-controller.validate" -}}
{{- $le := .Values.leaderElection }}
{{- $lease := include "dra-claim-controller.durationMillis" (list "leaderElection.leaseDuration" $le.leaseDuration) | atoi }}
{{- $renew := include "dra-claim-controller.durationMillis" (list "leaderElection.renewDeadline" $le.renewDeadline) | atoi }}
{{- $retry := include "dra-claim-controller.durationMillis" (list "leaderElection.retryPeriod" $le.retryPeriod) | atoi }}
{{- if le $lease $renew }}
{{- fail "leaderElection.leaseDuration must be greater than leaderElection.renewDeadline" }}
{{- end }}
{{- /* The controller refuses renew <= 1.2 x retry at start (client-go's rule): refuse it here. */}}
{{- if le (mul $renew 5) (mul $retry 6) }}
{{- fail "leaderElection.renewDeadline must be greater than 1.2 x leaderElection.retryPeriod" }}
{{- end }}
{{- if and (gt (int .Values.replicas) 1) (not $le.enabled) }}
{{- fail "leaderElection.enabled=false requires replicas <= 1: two active controllers would race on the same ResourceClaims" }}
{{- end }}
{{- if eq (int .Values.metrics.port) (int .Values.health.port) }}
{{- fail "metrics.port and health.port must differ" }}
{{- end }}
{{- if and .Values.serviceMonitor.enabled (not .Values.service.enabled) }}
{{- fail "serviceMonitor.enabled requires service.enabled" }}
{{- end }}
{{- if and .Values.pdb.enabled (ne (toString .Values.pdb.minAvailable) "") (ne (toString .Values.pdb.maxUnavailable) "") }}
{{- fail "pdb: set only one of minAvailable and maxUnavailable" }}
{{- end }}
{{- if and .Values.pdb.enabled (eq (toString .Values.pdb.minAvailable) "") (eq (toString .Values.pdb.maxUnavailable) "") }}
{{- fail "pdb: set one of minAvailable and maxUnavailable" }}
{{- end }}
{{- end }}

{{/*
The Secret holding the metrics serving certificate: metrics.tlsSecretName, or
the one the chart's cert-manager Certificate writes; empty: self-signed.
*/}}
{{- define "dra-claim-controller.metricsTLSSecret" -}}
{{- if .Values.metrics.tlsSecretName -}}
{{ .Values.metrics.tlsSecretName }}
{{- else if .Values.metrics.certManager.issuerRef.name -}}
{{ include "dra-claim-controller.fullname" . }}-metrics-tls
{{- end -}}
{{- end -}}

{{/* The metrics Service's DNS name, which the cert-manager certificate names. */}}
{{- define "dra-claim-controller.metricsServiceDNS" -}}
{{ include "dra-claim-controller.fullname" . }}-metrics.{{ .Release.Namespace }}.svc
{{- end -}}

{{/*
"true" when ResourcePoolStatusRequests are answered: poolStatusRequests.enabled
and DRAResourcePoolStatus=true in featureGates (its rights, and the
in-tree controller to turn off, follow this one rule).
*/}}
{{- define "dra-claim-controller.poolStatusRequests" -}}
{{- if and .Values.poolStatusRequests.enabled (regexMatch "(^|,)\\s*DRAResourcePoolStatus\\s*=\\s*true" .Values.featureGates) }}true{{ end }}
{{- end }}

{{/*
"true" when DeviceTaintRules are read in resource.k8s.io/v1 only: acting
as 1.38 (referenceRelease pinned to 1.38, or a cluster of 1.38 or later as
Helm sees it), where v1 is served by default and v1beta2 only with
--runtime-config.
*/}}
{{- define "dra-claim-controller.rulesV1Only" -}}
{{- if or (eq .Values.referenceRelease "1.38") (semverCompare ">=1.38-0" .Capabilities.KubeVersion.Version) }}true{{ end }}
{{- end }}
