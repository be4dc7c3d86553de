package main

import (
	"flag"

	"github.com/gpufrac/gpufrac/coordinator/app"
	"github.com/gpufrac/gpufrac/coordinator/consolidation"
)

// costFlags registers the flags of the price table and GPU-aware
// consolidation (issue 16) into cfg; it returns the price table's path.
func costFlags(cfg *app.Config) *string {
	priceTable := flag.String("price-table", "", "file (a mounted ConfigMap) with the admin's GPU instance types, their GPU counts and hourly prices: placeholders ask for the cheapest types, consolidation drains the node that saves the most (see coordinator/pricing)")
	co := &cfg.ConsolidationOptions
	*co = consolidation.DefaultOptions()
	flag.BoolVar(&cfg.Consolidation, "consolidation", false, "move the preemptible pods off a Karpenter GPU node when they fit on the others, so Karpenter can remove it (see coordinator/consolidation)")
	flag.DurationVar(&co.Interval, "consolidation-interval", co.Interval, "time between consolidation passes")
	flag.DurationVar(&co.StableFor, "consolidation-stable-for", co.StableFor, "how long a node must stay the best candidate, with no work pending, before its drain starts")
	flag.DurationVar(&co.DrainTimeout, "consolidation-drain-timeout", co.DrainTimeout, "a drain not done by then (node removed) is abandoned")
	flag.IntVar(&co.MaxDrainingNodes, "consolidation-max-draining-nodes", co.MaxDrainingNodes, "nodes drained at once")
	flag.IntVar(&co.MaxInFlight, "consolidation-max-in-flight", co.MaxInFlight, "disruption budget: moved pods still terminating or waiting to be placed, at most")
	flag.IntVar(&co.MaxMovesPerWindow, "consolidation-max-moves", co.MaxMovesPerWindow, "disruption budget: evictions per --consolidation-move-window, at most")
	flag.DurationVar(&co.MoveWindow, "consolidation-move-window", co.MoveWindow, "the window of --consolidation-max-moves")
	flag.Float64Var(&co.Planner.MinSavingPerMove, "consolidation-min-saving-per-move", co.Planner.MinSavingPerMove, "least saving per hour per pod restarted for a drain (price-table units; GPUs without a table)")
	flag.BoolVar(&co.Planner.MoveBarePods, "consolidation-move-bare-pods", false, "also move pods without a controller owner (nothing re-creates them after the eviction)")
	flag.BoolVar(&co.DeleteDrainedNodes, "consolidation-delete-drained-nodes", false, "delete a drained node once only DaemonSet and static pods run there, so that Karpenter terminates it at once (its documented manual disruption, which its NodePool's disruption budgets do not hold) instead of after its own emptiness consolidation; only nodes carrying Karpenter's finalizer karpenter.sh/termination and not annotated karpenter.sh/do-not-disrupt")
	return priceTable
}
