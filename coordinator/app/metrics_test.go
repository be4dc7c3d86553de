package app

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/rest"
)

func TestLeaderAndBuildInfoMetrics(t *testing.T) {
	// New builds clients without connecting: no API server is needed.
	a, err := New(Config{Version: "1.2.3"}, &rest.Config{Host: "https://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	want := func(leader string) string {
		return `
# HELP gpufrac_coordinator_leader 1 while this replica holds the leader-election Lease and schedules (always 1 without leader election), 0 while it stands by.
# TYPE gpufrac_coordinator_leader gauge
gpufrac_coordinator_leader ` + leader + "\n"
	}
	// A standby replica exports the gauge too, at 0.
	if err := testutil.GatherAndCompare(a.Registry(), strings.NewReader(want("0")), "gpufrac_coordinator_leader"); err != nil {
		t.Error(err)
	}
	a.leading.Store(true)
	if err := testutil.GatherAndCompare(a.Registry(), strings.NewReader(want("1")), "gpufrac_coordinator_leader"); err != nil {
		t.Error(err)
	}
	mfs, err := a.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() != "gpufrac_build_info" {
			continue
		}
		for _, l := range mf.GetMetric()[0].GetLabel() {
			if l.GetName() == "version" && l.GetValue() == "1.2.3" {
				found = true
			}
		}
	}
	if !found {
		t.Error("gpufrac_build_info{version=\"1.2.3\"} is not exported before Run")
	}
}
