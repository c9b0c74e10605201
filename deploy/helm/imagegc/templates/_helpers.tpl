{{/*
The name of every resource: fullnameOverride, else the release name when it
contains "imagegc" (so `helm install imagegc` gives the names of deploy/),
else "<release>-imagegc".
*/}}
{{- define "imagegc.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The labels the pods are selected by; never change on upgrade. */}}
{{- define "imagegc.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The labels of every resource. */}}
{{- define "imagegc.labels" -}}
{{ include "imagegc.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name (.Chart.Version | replace "+" "_") }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "imagegc.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "imagegc.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{/*
The namespace the NetworkPolicy admits to the metrics port: the managed
collectors' when one is on (GKE's gmp-system, AKS's kube-system, OpenShift's
openshift-user-workload-monitoring), else networkPolicy.scrapeNamespace.
*/}}
{{- define "imagegc.scrapeNamespace" -}}
{{- if .Values.gke.podMonitoring.enabled -}}gmp-system
{{- else if .Values.aks.podMonitor.enabled -}}kube-system
{{- else if .Values.openshift.userWorkloadMonitoring -}}openshift-user-workload-monitoring
{{- else -}}{{ .Values.networkPolicy.scrapeNamespace }}
{{- end -}}
{{- end -}}

{{/* Where the state directory is mounted in the container (state.dir). */}}
{{- define "imagegc.stateDir" -}}/var/lib/imagegc{{- end -}}

{{/*
Cross-field rules the schema cannot express, failing with the value's name.
*/}}
{{- define "imagegc.validate" -}}
{{- $dir := trimSuffix "/" .Values.runtime.socketDir -}}
{{- if not (hasPrefix (printf "unix://%s/" $dir) .Values.runtime.endpoint) -}}
{{- fail (printf "runtime.endpoint %q is not a socket inside runtime.socketDir %q, the only runtime directory the pod mounts" .Values.runtime.endpoint .Values.runtime.socketDir) -}}
{{- end -}}
{{- $root := trimSuffix "/" .Values.runtime.rootDir -}}
{{- if or (eq $root (include "imagegc.stateDir" .)) (eq $root "/etc/imagegc") (eq $root $dir) -}}
{{- fail (printf "runtime.rootDir %q collides with a path the pod already mounts (/var/lib/imagegc, /etc/imagegc, runtime.socketDir)" .Values.runtime.rootDir) -}}
{{- end -}}
{{- if and .Values.gc.imageFsPath (not (or (eq (trimSuffix "/" .Values.gc.imageFsPath) $root) (hasPrefix (printf "%s/" $root) .Values.gc.imageFsPath))) -}}
{{- fail (printf "gc.imageFsPath %q is not under runtime.rootDir %q, the runtime's image filesystem" .Values.gc.imageFsPath .Values.runtime.rootDir) -}}
{{- end -}}
{{- if ge (int .Values.gc.lowThresholdPercent) (int .Values.gc.highThresholdPercent) -}}
{{- fail (printf "gc.lowThresholdPercent (%d) must be less than gc.highThresholdPercent (%d)" (int .Values.gc.lowThresholdPercent) (int .Values.gc.highThresholdPercent)) -}}
{{- end -}}
{{- if ne (kindIs "invalid" .Values.gc.highInodesPercent) (kindIs "invalid" .Values.gc.lowInodesPercent) -}}
{{- fail "gc.highInodesPercent and gc.lowInodesPercent: set both or neither" -}}
{{- end -}}
{{- range $key, $value := dict "gc.interval" .Values.gc.interval "gc.usagePollInterval" .Values.gc.usagePollInterval "runtime.timeout" .Values.runtime.timeout -}}
{{- if gt (include "imagegc.milliseconds" $value | atoi) 86400000 -}}
{{- fail (printf "%s (%s) must be at most 1d" $key $value) -}}
{{- end -}}
{{- end -}}
{{- $stale := include "imagegc.milliseconds" .Values.kubernetes.podsStaleAfter | atoi -}}
{{- if eq $stale 0 -}}
{{- fail (printf "kubernetes.podsStaleAfter (%s) must be more than 0" .Values.kubernetes.podsStaleAfter) -}}
{{- end -}}
{{- range $key, $value := dict "gc.minAge" .Values.gc.minAge "gc.maxAge" .Values.gc.maxAge "gc.thrashWindow" .Values.gc.thrashWindow "kubernetes.podsStaleAfter" .Values.kubernetes.podsStaleAfter -}}
{{- if gt (include "imagegc.milliseconds" $value | atoi) 31536000000 -}}
{{- fail (printf "%s (%s) must be at most 365d" $key $value) -}}
{{- end -}}
{{- end -}}
{{- $interval := include "imagegc.milliseconds" .Values.gc.interval | atoi -}}
{{- $poll := include "imagegc.milliseconds" .Values.gc.usagePollInterval | atoi -}}
{{- if gt $poll $interval -}}
{{- fail (printf "gc.usagePollInterval (%s) must not be longer than gc.interval (%s)" .Values.gc.usagePollInterval .Values.gc.interval) -}}
{{- end -}}
{{- $minAge := include "imagegc.milliseconds" .Values.gc.minAge | atoi -}}
{{- $maxAge := include "imagegc.milliseconds" .Values.gc.maxAge | atoi -}}
{{- if and (ne $maxAge 0) (le $maxAge $minAge) -}}
{{- fail (printf "gc.maxAge (%s) must be greater than gc.minAge (%s), or 0s to disable age-based removal" .Values.gc.maxAge .Values.gc.minAge) -}}
{{- end -}}
{{- if and .Values.podMonitor.enabled .Values.serviceMonitor.enabled -}}
{{- fail "podMonitor.enabled and serviceMonitor.enabled: pick one, or every node is scraped twice" -}}
{{- end -}}
{{- if and .Values.openshift.userWorkloadMonitoring .Values.serviceMonitor.enabled -}}
{{- fail "openshift.userWorkloadMonitoring and serviceMonitor.enabled: pick one, or every node is scraped twice" -}}
{{- end -}}
{{- $managed := list -}}
{{- range $value, $namespace := dict "gke.podMonitoring.enabled" (and .Values.gke.podMonitoring.enabled "gmp-system") "aks.podMonitor.enabled" (and .Values.aks.podMonitor.enabled "kube-system") "openshift.userWorkloadMonitoring" (and .Values.openshift.userWorkloadMonitoring "openshift-user-workload-monitoring") -}}
{{- if $namespace -}}
{{- $managed = append $managed (printf "%s (scrapes from %s)" $value $namespace) -}}
{{- if not (has $.Values.networkPolicy.scrapeNamespace (list "monitoring" $namespace)) -}}
{{- fail (printf "networkPolicy.scrapeNamespace %q: %s scrapes from %s, which the NetworkPolicy then admits; leave networkPolicy.scrapeNamespace at monitoring" $.Values.networkPolicy.scrapeNamespace $value $namespace) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if gt (len $managed) 1 -}}
{{- fail (printf "%s: the NetworkPolicy admits one scraping namespace; pick one" (join " and " $managed)) -}}
{{- end -}}
{{- end -}}

{{/*
imagegc.toml, rendered from the values. With the default values it says
what deploy/imagegc.toml says (scripts/check-deploy.sh compares the two).
Strings go through toJson: a JSON string is a valid TOML basic string.
*/}}
{{- define "imagegc.config" -}}
# imagegc configuration, rendered by the imagegc Helm chart from its values.
# Edit the values, not this ConfigMap: `helm upgrade` restarts the pods when
# it changes (the pod template carries its checksum).

[runtime]
# The DaemonSet passes --runtime-endpoint for the socket it mounts.
endpoint = ""
timeout = {{ .Values.runtime.timeout | toJson }}
{{- if .Values.runtime.containerEvents }}
container_events = true
{{- end }}
{{- with .Values.runtime.sandboxImage }}
sandbox_image = {{ . | toJson }}
{{- end }}

[gc]
interval = {{ .Values.gc.interval | toJson }}
usage_poll_interval = {{ .Values.gc.usagePollInterval | toJson }}
high_threshold_percent = {{ int .Values.gc.highThresholdPercent }}
low_threshold_percent = {{ int .Values.gc.lowThresholdPercent }}
min_age = {{ .Values.gc.minAge | toJson }}
max_age = {{ .Values.gc.maxAge | toJson }}
dry_run = {{ .Values.gc.dryRun }}
{{- with .Values.gc.imageFsPath }}
image_fs_path = {{ . | toJson }}
{{- end }}
thrash_window = {{ .Values.gc.thrashWindow | toJson }}
order = {{ .Values.gc.order | toJson }}
headroom = {{ .Values.gc.headroom }}
{{- if not (kindIs "invalid" .Values.gc.highInodesPercent) }}
high_inodes_percent = {{ int .Values.gc.highInodesPercent }}
low_inodes_percent = {{ int .Values.gc.lowInodesPercent }}
{{- end }}

[protect]
images = {{ .Values.protect.images | toJson }}
keep_recent_per_repository = {{ int .Values.protect.keepRecentPerRepository }}

[state]
dir = {{ include "imagegc.stateDir" . | toJson }}
{{- if not .Values.state.usageLog }}
usage_log = false
{{- end }}

[metrics]
# The pod IP only (hostNetwork is off); the NetworkPolicy narrows who may
# connect.
listen = {{ .Values.metrics.listen | default (printf "0.0.0.0:%d" (int .Values.metrics.port)) | toJson }}

[kubernetes]
enabled = {{ .Values.kubernetes.enabled }}
{{- with .Values.kubernetes.nodeName }}
node_name = {{ . | toJson }}
{{- end }}
{{- with .Values.kubernetes.kubeconfig }}
kubeconfig = {{ . | toJson }}
{{- end }}
protect_pods = {{ .Values.kubernetes.protectPods }}
room_before_pulls = {{ .Values.kubernetes.roomBeforePulls }}
registry_manifests = {{ .Values.kubernetes.registryManifests | default false }}
{{- with .Values.kubernetes.registryEndpoints }}
{{- $pairs := list }}
{{- range $registry, $address := . }}
{{- $pairs = append $pairs (printf "%s = %s" ($registry | toJson) ($address | toJson)) }}
{{- end }}
registry_endpoints = { {{ join ", " $pairs }} }
{{- end }}
node_events = {{ .Values.kubernetes.nodeEvents }}
pods_stale_after = {{ .Values.kubernetes.podsStaleAfter | toJson }}
{{- end -}}

{{/*
A duration as the schema admits it (30s, 5m, 1h30m, 2d, 500ms) in
milliseconds, so that the cross-field rules compare what imagegc compares.
*/}}
{{- define "imagegc.milliseconds" -}}
{{- $units := dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000 "d" 86400000 "w" 604800000 -}}
{{- $total := 0 -}}
{{- range regexFindAll "[0-9]+(ms|s|m|h|d|w)" (toString .) -1 -}}
{{- $total = add $total (mul (regexFind "^[0-9]+" . | atoi) (get $units (regexReplaceAll "^[0-9]+" . ""))) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/*
deploy/prometheus-rules.yaml (files/prometheus-rules.yaml, a copy that
scripts/check-deploy.sh keeps identical) with the release's own names:
ImagegcDown matches the job of this release's monitor (<namespace>/<fullname>,
or the PodMonitoring's <fullname>), and the descriptions name its namespace
and DaemonSet. The PrometheusRule and GKE's Rules both carry it.
*/}}
{{- define "imagegc.releaseRules" -}}
{{- $name := include "imagegc.fullname" . -}}
{{- .Files.Get "files/prometheus-rules.yaml"
      | replace "job=~\"(.*/)?imagegc\"" (printf "job=~\"(.*/)?%s\"" $name)
      | replace "kubectl -n imagegc get pods" (printf "kubectl -n %s get pods" .Release.Namespace)
      | replace "kubectl -n imagegc get daemonset imagegc" (printf "kubectl -n %s get daemonset %s" .Release.Namespace $name) -}}
{{- end -}}
