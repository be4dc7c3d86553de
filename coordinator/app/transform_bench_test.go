package app

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/client-go/kubernetes/scheme"
)

// scalePodFixtures are pods as the API server served them in the scale
// benchmark (tests/e2e TestScale, 2026-11-24): a bound fraction, a bound
// whole-GPU pod and a pending gang member, each with the managed fields,
// service-account volume, defaults and kwok's status the informer decodes.
var scalePodFixtures = []string{"scale-pod-frac-00001.json", "scale-pod-whole-00003.json", "scale-pod-gang-000-001.json"}

// BenchmarkInformerPods measures what the informer's pods cost on the heap:
// n pods (the fixtures in turn, each with its own name and uid) decoded by
// the JSON serializer the clientset uses, passed through a transform, and
// held as the informer's store holds them. heap-B/pod is the live heap
// after a GC divided by n; ns/op is one pod's decode and transform.
//
//	go test ./coordinator/app -run XXX -bench BenchmarkInformerPods -benchtime 50000x
func BenchmarkInformerPods(b *testing.B) {
	var templates [][]byte
	for _, f := range scalePodFixtures {
		raw, err := os.ReadFile(filepath.Join("testdata", f))
		if err != nil {
			b.Fatal(err)
		}
		templates = append(templates, raw)
	}
	for _, tc := range []struct {
		name      string
		transform func(any) (any, error)
	}{
		{"none", func(o any) (any, error) { return o, nil }},
		{"trimObject", trimObject},
		{"shared", newSharer().transform},
	} {
		b.Run(tc.name, func(b *testing.B) {
			dec := json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme.Scheme, scheme.Scheme, json.SerializerOptions{})
			held := make([]any, 0, b.N)
			var before runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t := templates[i%len(templates)]
				raw := bytes.ReplaceAll(t, []byte(`"uid": "`), fmt.Appendf(nil, `"uid": "%08d-`, i))
				raw = bytes.Replace(raw, []byte(`"name": "`), fmt.Appendf(nil, `"name": "p%d-`, i), 1)
				obj, _, err := dec.Decode(raw, nil, nil)
				if err != nil {
					b.Fatal(err)
				}
				if _, ok := obj.(*corev1.Pod); !ok {
					b.Fatalf("decoded %T", obj)
				}
				out, err := tc.transform(obj)
				if err != nil {
					b.Fatal(err)
				}
				held = append(held, out)
			}
			b.StopTimer()
			var after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(b.N), "heap-B/pod")
			runtime.KeepAlive(held)
		})
	}
}
