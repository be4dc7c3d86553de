// Package apitest makes client-go's fake clientsets fail on demand, as
// Karpenter's fakes take NextCreateErr: an Injection makes the next n
// requests of a verb on a resource fail with a given error, so the code
// behind an API seam has tests of its failure paths, not only of the happy
// one.
package apitest

import (
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
)

// Injection is a failure point planted in a fake clientset. Its methods are
// safe while the clientset is in use (client-go's Fake is not: reactors
// must be added before the code under test starts, so Install first and
// arm later).
type Injection struct {
	mu    sync.Mutex
	left  int
	err   error
	fired int
}

// Install plants an injection, disarmed, for requests with verb ("create",
// "delete", "patch", "update", "get", ...) on resource ("pods", "leases",
// ...). subresource narrows it ("binding", "eviction", "status"); ""
// matches any request on the resource, subresources included. Pass the
// clientset's Fake field (fake.Clientset.Fake or the dynamic fake's).
func Install(f *k8stesting.Fake, verb, resource, subresource string) *Injection {
	inj := &Injection{}
	f.PrependReactor(verb, resource, func(a k8stesting.Action) (bool, runtime.Object, error) {
		if subresource != "" && a.GetSubresource() != subresource {
			return false, nil, nil
		}
		inj.mu.Lock()
		defer inj.mu.Unlock()
		if inj.left == 0 {
			return false, nil, nil
		}
		inj.left--
		inj.fired++
		return true, nil, inj.err
	})
	return inj
}

// FailNext arms the injection: the next n matching requests fail with err;
// requests after the n-th reach the fake's tracker as usual.
func (i *Injection) FailNext(n int, err error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.left, i.err = n, err
}

// Fired is how many requests the injection failed so far.
func (i *Injection) Fired() int {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.fired
}

// Left is how many more requests it will fail.
func (i *Injection) Left() int {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.left
}

// FailNext installs an injection that fails the next n matching requests
// with err (see Install), before the code under test runs.
func FailNext(f *k8stesting.Fake, verb, resource, subresource string, n int, err error) *Injection {
	inj := Install(f, verb, resource, subresource)
	inj.FailNext(n, err)
	return inj
}

// FailOnce is FailNext for one request.
func FailOnce(f *k8stesting.Fake, verb, resource, subresource string, err error) *Injection {
	return FailNext(f, verb, resource, subresource, 1, err)
}
