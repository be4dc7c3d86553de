package nvidia

import (
	"context"
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
)

const (
	// defaultXidWait is nvmlLib.xidWait: a WatchXids goroutine outlives its
	// ctx by at most about a second.
	defaultXidWait = time.Second
	// xidBuffer is the capacity of a WatchXids channel.
	xidBuffer = 64
)

// xidRetryBackoff spaces out waits after NVML reported an error, so a
// broken event set does not spin a core: 1 s, doubling up to 10 s while the
// errors go on, each up to 10 % longer at random; a wait that succeeds or
// times out starts it again.
var xidRetryBackoff = wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Steps: 4, Cap: 10 * time.Second}

// WatchXids implements Lib. It creates one NVML event set per call,
// registers every GPU that supports critical Xid events (the others are
// logged and skipped), and runs one goroutine that waits on the set until
// ctx ends, then frees it and closes the channel.
func (n *nvmlLib) WatchXids(ctx context.Context) (<-chan XidEvent, error) {
	logger := klog.FromContext(ctx)
	set, ret := n.nvml.EventSetCreate()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("creating NVML event set: %w", nvmlError(ret))
	}
	registered, err := n.registerXids(ctx, set)
	if err == nil && registered == 0 {
		err = fmt.Errorf("registering Xid events: no GPU supports them: %w", ErrNotSupported)
	}
	if err != nil {
		if ret := set.Free(); ret != nvml.SUCCESS {
			logger.Error(nvmlError(ret), "Cannot free NVML event set")
		}
		return nil, err
	}
	logger.V(2).Info("Watching Xid events", "gpus", registered)
	out := make(chan XidEvent, xidBuffer)
	go n.waitXids(ctx, set, out)
	return out, nil
}

// registerXids registers every GPU that supports critical Xid events on set
// and returns how many it registered.
func (n *nvmlLib) registerXids(ctx context.Context, set nvml.EventSet) (int, error) {
	logger := klog.FromContext(ctx)
	count, ret := n.nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return 0, fmt.Errorf("counting GPUs: %w", nvmlError(ret))
	}
	registered := 0
	for i := range count {
		d, err := n.deviceByIndex(i)
		if err != nil {
			logger.Error(err, "Not watching Xid events of GPU", "index", i)
			continue
		}
		supported, ret := d.GetSupportedEventTypes()
		if ret != nvml.SUCCESS {
			logger.Error(nvmlError(ret), "Not watching Xid events of GPU: cannot get supported event types", "index", i)
			continue
		}
		if supported&nvml.EventTypeXidCriticalError == 0 {
			logger.Info("Not watching Xid events of GPU: not supported", "index", i)
			continue
		}
		if ret := d.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
			logger.Error(nvmlError(ret), "Not watching Xid events of GPU: cannot register", "index", i)
			continue
		}
		registered++
	}
	return registered, nil
}

// waitXids forwards set's Xid events to out until ctx ends, then frees set
// and closes out.
func (n *nvmlLib) waitXids(ctx context.Context, set nvml.EventSet, out chan<- XidEvent) {
	logger := klog.FromContext(ctx)
	defer close(out)
	defer func() {
		if ret := set.Free(); ret != nvml.SUCCESS {
			logger.Error(nvmlError(ret), "Cannot free NVML event set")
		}
	}()
	retry := xidRetryBackoff
	for ctx.Err() == nil {
		data, ret := set.Wait(uint32(n.xidWait / time.Millisecond))
		switch ret {
		case nvml.SUCCESS:
			retry = xidRetryBackoff
		case nvml.ERROR_TIMEOUT:
			retry = xidRetryBackoff
			continue
		default:
			// Lost GPUs also show in Memory errors, which health polls;
			// here only retry, without spinning.
			d := retry.Step()
			logger.Error(nvmlError(ret), "Waiting for NVML events failed; will retry", "retryIn", d)
			select {
			case <-ctx.Done():
			case <-time.After(d):
			}
			continue
		}
		if data.EventType != nvml.EventTypeXidCriticalError {
			continue
		}
		ev := XidEvent{Xid: data.EventData, Time: n.clock.Now()}
		// An event NVML cannot tie to a GPU is still delivered, with an
		// empty UUID: the consumer decides (the NVIDIA device plugin marks
		// every GPU unhealthy then).
		if data.Device != nil {
			uuid, ret := data.Device.GetUUID()
			if ret != nvml.SUCCESS {
				logger.Error(nvmlError(ret), "Cannot get UUID of GPU with Xid", "xid", ev.Xid)
				uuid = ""
			}
			ev.UUID = uuid
		}
		select {
		case out <- ev:
		case <-ctx.Done():
			return
		}
	}
}
