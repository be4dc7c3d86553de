// Wrapper module that pins the Prometheus Operator's CRDs (ServiceMonitor,
// PodMonitor, PrometheusRule): tests/tools/tools.mk copies them from this
// module into bin/prometheus-operator-crds, so the chart's monitoring objects
// are validated by a real API server. Nothing is built from it.
module github.com/gpufrac/gpufrac/tests/tools/prometheus-operator

go 1.26.0
