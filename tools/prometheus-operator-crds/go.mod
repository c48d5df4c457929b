// The Prometheus Operator's module, for its CRDs only (example/prometheus-operator-crd): the stack
// installs ServiceMonitor, PodMonitor and PrometheusRule so the chart's monitoring objects are real.
module fibers.local/prometheus-operator-crds

go 1.24

require github.com/prometheus-operator/prometheus-operator v0.85.0
