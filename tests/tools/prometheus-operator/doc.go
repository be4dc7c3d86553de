// Package tools pins the Prometheus Operator module for its CRD files only.
package tools
