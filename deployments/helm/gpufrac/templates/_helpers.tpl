{{/* Labels every object of the chart carries. */}}
{{- define "gpufrac.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/part-of: gpufrac
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of a component: (dict "name" "gpufrac-node"). */}}
{{- define "gpufrac.selectorLabels" -}}
app.kubernetes.io/name: {{ .name }}
{{- end -}}

{{/*
The image of a component: (dict "image" .Values.node.image "root" $). The tag
is the chart's appVersion unless set, and never "latest": a moving tag would
let two nodes run two versions under one release.
*/}}
{{- define "gpufrac.image" -}}
{{- $tag := .image.tag | default .root.Chart.AppVersion -}}
{{- if eq $tag "latest" -}}
{{- fail (printf "%s: the tag \"latest\" is not allowed; leave tag empty for the chart's appVersion (%s) or name a release" .image.repository .root.Chart.AppVersion) -}}
{{- end -}}
{{- if .image.digest -}}
{{- printf "%s@%s" (include "gpufrac.registry" (dict "ref" .image.repository "root" .root)) .image.digest -}}
{{- else -}}
{{- printf "%s:%s" (include "gpufrac.registry" (dict "ref" .image.repository "root" .root)) $tag -}}
{{- end -}}
{{- end -}}

{{/*
An image reference under global.imageRegistry, when set: (dict "ref"
"ghcr.io/gpufrac/gpufrac-node" "root" $). The reference's own registry (its
first path segment, when it has a "." or ":" or is "localhost") is replaced by
global.imageRegistry; a reference without one gets it in front.
*/}}
{{- define "gpufrac.registry" -}}
{{- $reg := dig "imageRegistry" "" (.root.Values.global | default dict) | trimSuffix "/" -}}
{{- if $reg -}}
{{- $parts := splitn "/" 2 .ref -}}
{{- $first := $parts._0 -}}
{{- if and $parts._1 (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- printf "%s/%s" $reg $parts._1 -}}
{{- else -}}
{{- printf "%s/%s" $reg .ref -}}
{{- end -}}
{{- else -}}
{{- .ref -}}
{{- end -}}
{{- end -}}

{{/* The service account of gpufrac-node (node.serviceAccount.name, default gpufrac-node). */}}
{{- define "gpufrac.nodeServiceAccount" -}}
{{- .Values.node.serviceAccount.name | default "gpufrac-node" -}}
{{- end -}}

{{/* The service account of gpufrac-coordinator (coordinator.serviceAccount.name, default gpufrac-coordinator). */}}
{{- define "gpufrac.coordinatorServiceAccount" -}}
{{- .Values.coordinator.serviceAccount.name | default "gpufrac-coordinator" -}}
{{- end -}}

{{/*
Whether the cluster serves DRA's resource.k8s.io/v1 (GA in Kubernetes 1.34):
"true" or "". `helm template` assumes it for its default version; pass
--kube-version (and --api-versions) to render for another cluster.
*/}}
{{- define "gpufrac.draAPI" -}}
{{- if and (.Capabilities.APIVersions.Has "resource.k8s.io/v1") (semverCompare ">=1.34.0-0" .Capabilities.KubeVersion.Version) -}}true{{- end -}}
{{- end -}}

{{/* The reservation namespace, never the release's own: only reservation and placeholder pods may live there. */}}
{{- define "gpufrac.reservationNamespace" -}}
{{- if eq .Release.Namespace .Values.reservationNamespace.name -}}
{{- fail (printf "the release namespace is %s, the reservation namespace, where only gpufrac-coordinator's reservation and placeholder pods may live: install the components into their own namespace (--namespace gpufrac-system)" .Release.Namespace) -}}
{{- end -}}
{{- .Values.reservationNamespace.name -}}
{{- end -}}

{{/* A Go duration of whole seconds, minutes or hours ("90s", "2m", "1h") in seconds. */}}
{{- define "gpufrac.seconds" -}}
{{- $d := toString . -}}
{{- if hasSuffix "ms" $d -}}0
{{- else if hasSuffix "h" $d -}}{{ mul (trimSuffix "h" $d | int) 3600 }}
{{- else if hasSuffix "m" $d -}}{{ mul (trimSuffix "m" $d | int) 60 }}
{{- else if hasSuffix "s" $d -}}{{ trimSuffix "s" $d | int }}
{{- else -}}{{ fail (printf "%q is not a duration of whole seconds, minutes or hours" $d) }}
{{- end -}}
{{- end -}}

{{/*
The validationActions of the policies that hold tenants' workloads:
admissionPolicies.tenantValidationActions, else validationActions.
*/}}
{{- define "gpufrac.tenantValidationActions" -}}
{{- $a := .Values.admissionPolicies.tenantValidationActions | default .Values.admissionPolicies.validationActions -}}
{{- if and (has "Deny" $a) (has "Warn" $a) -}}
{{- fail "admissionPolicies.tenantValidationActions: Deny and Warn cannot be combined (the API server refuses such a binding): use [Deny] or [Warn, Audit]" -}}
{{- end -}}
{{- toJson $a -}}
{{- end }}
