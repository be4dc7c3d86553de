// Wrapper module that pins the Prometheus Operator's CRDs (ServiceMonitor,
// PodMonitor, PrometheusRule): tests/tools/tools.mk copies them from this
// module into bin/prometheus-operator-crds, so the chart's monitoring objects
// are validated by a real API server. Nothing is built from it, so go mod tidy
// would drop the require: do not tidy this module.
module github.com/gpufrac/gpufrac/tests/tools/prometheus-operator

go 1.26.0

require github.com/prometheus-operator/prometheus-operator v0.85.0
