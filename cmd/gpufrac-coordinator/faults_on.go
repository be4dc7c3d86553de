//go:build faultinject

package main

import (
	"os"

	"github.com/gpufrac/gpufrac/coordinator/faultpoint"
	"github.com/gpufrac/gpufrac/coordinator/scheduler"
)

// faultPoint reads GPUFRAC_FAULT_PAUSE ("point" or "point=marker-file"):
// the chaos suite's binary pauses there (package faultpoint).
func faultPoint() (scheduler.Faults, error) {
	p, err := faultpoint.Parse(os.Getenv("GPUFRAC_FAULT_PAUSE"))
	if p == nil || err != nil {
		return nil, err
	}
	return p, nil
}
