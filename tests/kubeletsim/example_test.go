package kubeletsim_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/gpufrac/gpufrac/tests/kubeletsim"
	"github.com/gpufrac/gpufrac/tests/kubeletsim/kubeletsimtest"
)

// A simulated node with a fake plugin: wait for the devices, admit a
// container, and read the answer the plugin gave.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dir, err := os.MkdirTemp("", "ks")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)

	k := kubeletsim.New(kubeletsim.Options{
		NodeName:           "node-a",
		Dir:                dir,
		PodResourcesSocket: filepath.Join(dir, "pr.sock"),
	})
	if err := k.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer k.Stop()

	plugin := kubeletsimtest.New(kubeletsimtest.Options{
		Dir:                 dir,
		Endpoint:            "gpu.sock",
		Resource:            "example.com/gpu",
		Devices:             kubeletsimtest.Devices("gpu", 4),
		PreferredAllocation: true,
	})
	if err := plugin.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer plugin.Stop()

	err = k.WaitForResource(ctx, "example.com/gpu", func(s kubeletsim.ResourceState) bool { return s.Allocatable == 4 })
	if err != nil {
		fmt.Println(err)
		return
	}
	a, err := k.Allocate(ctx, kubeletsim.PodRef{Namespace: "team-a", Name: "train", UID: "u1"}, "main", "example.com/gpu", 2)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(a.DeviceIDs, a.Response.Envs[kubeletsimtest.EnvDevices])
	s, _ := k.Resource("example.com/gpu")
	fmt.Printf("capacity %d, allocatable %d, allocated %d\n", s.Capacity, s.Allocatable, s.Allocated)
	// Output:
	// [gpu-2 gpu-3] gpu-3,gpu-2
	// capacity 4, allocatable 4, allocated 2
}
