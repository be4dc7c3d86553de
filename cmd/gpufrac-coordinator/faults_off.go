//go:build !faultinject

package main

import "github.com/gpufrac/gpufrac/coordinator/scheduler"

// faultPoint is nil in every build but the chaos suite's (-tags faultinject).
func faultPoint() (scheduler.Faults, error) { return nil, nil }
