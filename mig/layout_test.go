package mig_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/mig"
)

// mockProfiles reads the MIG profile table of a go-nvml mock GPU model
// through the NVML adapter (this test package may import it; package mig may not).
func mockProfiles(t *testing.T, model string) []mig.Profile {
	t.Helper()
	m, err := nvidia.NewMock(model)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Init(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Shutdown() })
	gs, err := m.GPUs()
	if err != nil {
		t.Fatal(err)
	}
	ps, err := m.MIGProfiles(gs[0].UUID)
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

func TestExpand(t *testing.T) {
	a100, h100 := mockProfiles(t, "dgxa100"), mockProfiles(t, "dgxh100")
	tests := []struct {
		name     string
		profiles []mig.Profile
		layout   string
		want     string // profile names, comma-separated
		wantErr  string
	}{
		{name: "empty keeps the layout", profiles: h100, layout: "", want: ""},
		{name: "a100 all-1g.10gb", profiles: a100, layout: "all-1g.10gb", want: "1g.10gb,1g.10gb,1g.10gb,1g.10gb"},
		{name: "a100 all-1g.5gb", profiles: a100, layout: "all-1g.5gb", want: "1g.5gb,1g.5gb,1g.5gb,1g.5gb,1g.5gb,1g.5gb,1g.5gb"},
		{name: "a100 all-3g.20gb", profiles: a100, layout: "all-3g.20gb", want: "3g.20gb,3g.20gb"},
		{name: "a100 all-7g.40gb", profiles: a100, layout: "all-7g.40gb", want: "7g.40gb"},
		{name: "a100 balanced", profiles: a100, layout: "all-balanced", want: "3g.20gb,2g.10gb,1g.5gb,1g.5gb"},
		{name: "h100 all-3g.40gb", profiles: h100, layout: "all-3g.40gb", want: "3g.40gb,3g.40gb"},
		{name: "h100 all-1g.10gb", profiles: h100, layout: "all-1g.10gb", want: "1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb"},
		{name: "h100 balanced", profiles: h100, layout: "all-balanced", want: "3g.40gb,2g.20gb,1g.10gb,1g.10gb"},
		{name: "h100 list sorted largest first", profiles: h100, layout: "1g.10gb, 3g.40gb,1g.10gb+me,2g.20gb", want: "3g.40gb,2g.20gb,1g.10gb,1g.10gb+me"},
		{name: "h100 4g beside 3g", profiles: h100, layout: "4g.40gb,3g.40gb", want: "4g.40gb,3g.40gb"},
		{name: "unknown profile for the model", profiles: a100, layout: "3g.40gb",
			wantErr: "unknown profile 3g.40gb for this GPU model (it offers 1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb)"},
		{name: "unknown profile in all-", profiles: h100, layout: "all-2g.10gb", wantErr: "unknown profile 2g.10gb for this GPU model"},
		{name: "compute-instance profile", profiles: h100, layout: "1c.3g.40gb", wantErr: "1c.3g.40gb is a compute-instance profile; layouts list GPU-instance profiles such as 3g.40gb"},
		{name: "more instances than the model allows", profiles: h100, layout: "4g.40gb,4g.40gb", wantErr: "2 instances of 4g.40gb, but the GPU allows at most 1"},
		{name: "more slices than the GPU has", profiles: h100, layout: "4g.40gb,3g.40gb,1g.10gb", wantErr: "it needs 8 compute slices, the GPU has 7"},
		{name: "slices fit but placements do not", profiles: a100, layout: "3g.20gb,3g.20gb,1g.5gb", wantErr: "no placement holds 3g.20gb,3g.20gb,1g.5gb together"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := mig.Expand(tc.layout, tc.profiles)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Expand(%q) error = %v, want one containing %q", tc.layout, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Expand(%q): %v", tc.layout, err)
			}
			if diff := cmp.Diff(tc.want, strings.Join(profileNames(got), ",")); diff != "" {
				t.Errorf("Expand(%q) (-want +got):\n%s", tc.layout, diff)
			}
			// Whatever Expand returns must be placeable on an empty GPU.
			at, ok := mig.Place(got, nil)
			if !ok {
				t.Fatalf("Expand(%q) returned an unplaceable layout", tc.layout)
			}
			for i := range at {
				for j := range i {
					if at[i].Overlaps(at[j]) {
						t.Errorf("placements %v and %v overlap", at[i], at[j])
					}
				}
			}
		})
	}
}

func TestResourceName(t *testing.T) {
	for _, tc := range []struct{ profile, want string }{
		{"1g.10gb", "nvidia.com/mig-1g.10gb"},
		{"1g.10gb+me", "nvidia.com/mig-1g.10gb.me"},
		{"1g.20gb+me.all", "nvidia.com/mig-1g.20gb.me.all"},
		{"1g.10gb-me", "nvidia.com/mig-1g.10gb-me"},
		{"1c.3g.40gb", "nvidia.com/mig-1c.3g.40gb"},
	} {
		t.Run(tc.profile, func(t *testing.T) {
			if got := mig.ResourceName(tc.profile); got != tc.want {
				t.Errorf("ResourceName(%q) = %q, want %q", tc.profile, got, tc.want)
			}
		})
	}
}

// gi builds a clean GPU instance of profile p at start.
func gi(id int, p mig.Profile, start int) mig.GPUInstance {
	return mig.GPUInstance{
		ID: id, ProfileID: p.ID, Profile: p.Name,
		Placement: mig.Placement{Start: start, Size: p.Placements[0].Size},
		Devices:   []mig.Device{{GI: id, Profile: p.Name, Full: true, MemoryBytes: p.MemoryMB << 20}},
	}
}

func TestDiff(t *testing.T) {
	h100 := mockProfiles(t, "dgxh100")
	p := map[string]mig.Profile{}
	for _, x := range h100 {
		p[x.Name] = x
	}
	expand := func(layout string) []mig.Profile {
		w, err := mig.Expand(layout, h100)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	split := gi(9, p["3g.40gb"], 4)
	split.Devices = []mig.Device{{GI: 9, CI: 0, Profile: "1c.3g.40gb"}, {GI: 9, CI: 1, Profile: "1c.3g.40gb"}}
	tests := []struct {
		name      string
		instances []mig.GPUInstance
		want      []mig.Profile
		steps     []string
	}{
		{name: "match needs nothing", instances: []mig.GPUInstance{gi(1, p["3g.40gb"], 4), gi(2, p["3g.40gb"], 0)}, want: expand("all-3g.40gb")},
		{name: "empty GPU", want: expand("3g.40gb,1g.10gb"), steps: []string{"create 3g.40gb@0", "create 1g.10gb@3"}},
		{name: "keeps instances of the new layout", instances: []mig.GPUInstance{gi(0, p["1g.10gb"], 0), gi(1, p["1g.10gb"], 1), gi(2, p["1g.10gb"], 2), gi(3, p["1g.10gb"], 4)},
			want: expand("3g.40gb,1g.10gb,1g.10gb"), steps: []string{"destroy 2", "destroy 3", "create 3g.40gb@4"}},
		{name: "starts over when kept instances block the rest", instances: []mig.GPUInstance{gi(0, p["1g.10gb"], 3)},
			want: expand("4g.40gb,1g.10gb"), steps: []string{"destroy 0", "create 4g.40gb@0", "create 1g.10gb@4"}},
		{name: "split instance is replaced", instances: []mig.GPUInstance{split},
			want: expand("3g.40gb"), steps: []string{"destroy 9", "create 3g.40gb@0"}},
		{name: "no layout destroys everything", instances: []mig.GPUInstance{gi(0, p["7g.80gb"], 0)}, steps: []string{"destroy 0"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, s := range mig.Diff(tc.instances, tc.want) {
				if s.Destroy >= 0 {
					got = append(got, "destroy "+strconv.Itoa(s.Destroy))
				} else {
					got = append(got, "create "+s.Create.Name+"@"+strconv.Itoa(s.At.Start))
				}
			}
			if diff := cmp.Diff(tc.steps, got); diff != "" {
				t.Errorf("Diff (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDescribe(t *testing.T) {
	h100 := mockProfiles(t, "dgxh100")
	p := map[string]mig.Profile{}
	for _, x := range h100 {
		p[x.Name] = x
	}
	empty := gi(5, p["2g.20gb"], 0)
	empty.Devices = nil
	got := mig.Describe([]mig.GPUInstance{gi(1, p["1g.10gb"], 6), gi(2, p["3g.40gb"], 0), empty, gi(3, p["1g.10gb+me"], 5)})
	if want := "3g.40gb,1g.10gb,1g.10gb+me"; got != want {
		t.Errorf("Describe() = %q, want %q", got, want)
	}
}

// profileNames lists the profiles' names in order.
func profileNames(ps []mig.Profile) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Name
	}
	return out
}
