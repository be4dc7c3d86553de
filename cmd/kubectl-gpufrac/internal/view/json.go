package view

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// Document is the JSON shape of the node view (kubectl gpufrac -o json).
// Fields are only added, never renamed or removed; docs/kubectl-gpufrac.md documents them.
type Document struct {
	// Nodes are the GPU nodes by name.
	Nodes []NodeDoc `json:"nodes"`
	// Pending, Placeholders and Rejected are as in View.
	Pending      []PodDoc `json:"pending"`
	Placeholders []PodDoc `json:"placeholders"`
	Rejected     []PodDoc `json:"rejected"`
}

// NodeDoc is one node in a Document.
type NodeDoc struct {
	Name         string `json:"name"`
	Ready        bool   `json:"ready"`
	Cordoned     bool   `json:"cordoned"`
	Inventory    bool   `json:"inventory"`
	DRA          bool   `json:"dra"`
	NodePool     string `json:"nodePool,omitempty"`
	InstanceType string `json:"instanceType,omitempty"`
	// Allocatable counts: whole GPUs, fraction units, MIG devices by resource.
	WholeGPUs     int64            `json:"wholeGPUs"`
	FractionUnits int64            `json:"fractionUnits"`
	MIG           map[string]int64 `json:"mig,omitempty"`
	GPUs          []GPUDoc         `json:"gpus"`
	// Unplaced are holdings not tied to a GPU yet.
	Unplaced []HolderDoc `json:"unplaced,omitempty"`
	// DoNotDisrupt are the pods (namespace/name) keeping Karpenter off the node.
	DoNotDisrupt []string `json:"doNotDisrupt,omitempty"`
}

// GPUDoc is one GPU in a Document.
type GPUDoc struct {
	Index       int    `json:"index"`
	UUID        string `json:"uuid"`
	Model       string `json:"model"`
	MemoryMiB   uint64 `json:"memoryMiB"`
	Mode        string `json:"mode"`
	Healthy     bool   `json:"healthy"`
	UsedPercent int    `json:"usedPercent"`
	// Reserved is set when a reservation pod holds the GPU for fractions.
	Reserved bool        `json:"reserved"`
	Holders  []HolderDoc `json:"holders"`
}

// HolderDoc is one pod holding (part of) a GPU in a Document.
type HolderDoc struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Role is one of whole, fraction, reservation, placeholder, claim, mig.
	Role string `json:"role"`
	// Percent is the share of the GPU (fractions and claims), Whole the whole
	// GPUs held (1 per GPU entry; more in Unplaced).
	Percent     int    `json:"percent,omitempty"`
	Whole       int    `json:"whole,omitempty"`
	Reservation bool   `json:"reservation"`
	Phase       string `json:"phase,omitempty"`
	Terminating bool   `json:"terminating,omitempty"`
	Gang        string `json:"gang,omitempty"`
	Claim       string `json:"claim,omitempty"`
	Detail      string `json:"detail,omitempty"`
}

// PodDoc is a pending, placeholder or rejected pod in a Document.
type PodDoc struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Request   string `json:"request"`
	Queue     string `json:"queue,omitempty"`
	Why       string `json:"why,omitempty"`
}

// Doc converts the view to its JSON shape.
func (v *View) Doc() Document {
	d := Document{Nodes: []NodeDoc{}, Pending: podDocs(v.Pending), Placeholders: podDocs(v.Placeholders), Rejected: podDocs(v.Rejected)}
	for _, n := range v.Nodes {
		nd := NodeDoc{Name: n.Name, Ready: n.Ready, Cordoned: n.Cordoned, Inventory: n.Inventory, DRA: n.DRA, NodePool: n.NodePool,
			InstanceType: n.InstanceType, WholeGPUs: n.WholeGPUs, FractionUnits: n.FractionUnits, MIG: n.MIG, GPUs: []GPUDoc{}}
		for _, g := range n.GPUs {
			gd := GPUDoc{Index: g.Index, UUID: g.UUID, Model: g.Model, MemoryMiB: g.MemoryMiB, Mode: g.Mode, Healthy: g.Healthy,
				UsedPercent: g.UsedPercent(), Reserved: g.Reserved(), Holders: []HolderDoc{}}
			for _, h := range g.Holders {
				gd.Holders = append(gd.Holders, holderDoc(h))
			}
			nd.GPUs = append(nd.GPUs, gd)
		}
		for _, h := range n.Unplaced {
			nd.Unplaced = append(nd.Unplaced, holderDoc(h))
		}
		for _, h := range n.DoNotDisrupt {
			nd.DoNotDisrupt = append(nd.DoNotDisrupt, h.Pod)
		}
		d.Nodes = append(d.Nodes, nd)
	}
	return d
}

// RenderJSON prints the view's Document, indented.
func (v *View) RenderJSON(w io.Writer) error {
	return WriteJSON(w, v.Doc())
}

// WriteJSON prints doc as indented JSON with a trailing newline.
func WriteJSON(w io.Writer, doc any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return fmt.Errorf("printing JSON: %w", err)
	}
	return nil
}

func holderDoc(h Holder) HolderDoc {
	ns, name := splitPod(h.Pod)
	return HolderDoc{Namespace: ns, Name: name, Role: string(h.Role), Percent: h.Percent, Whole: h.Whole,
		Reservation: h.Role == RoleReservation, Phase: string(h.Phase), Terminating: h.Terminating, Gang: h.Gang,
		Claim: h.Claim, Detail: h.Detail}
}

func podDocs(ps []Pod) []PodDoc {
	out := []PodDoc{}
	for _, p := range ps {
		ns, name := splitPod(p.Pod)
		out = append(out, PodDoc{Namespace: ns, Name: name, Request: p.Request, Queue: p.Queue, Why: p.Why})
	}
	return out
}

// splitPod splits "namespace/name"; a claim reserved for no pod
// ("(claim ns/c)") keeps its whole text as the name.
func splitPod(s string) (namespace, name string) {
	if strings.HasPrefix(s, "(") {
		return "", s
	}
	if ns, n, ok := strings.Cut(s, "/"); ok {
		return ns, n
	}
	return "", s
}
