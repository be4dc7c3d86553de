// Command workload is the test bed's GPU workload image: it reports what its
// container sees, one JSON line on stdout (the container log the tests read
// from the node), then waits until it is stopped or -sleep passes.
//
// It reports the environment gpufrac and the NVIDIA toolkit set, the
// /dev/nvidia* device nodes with their numbers, its mount points, its cgroup
// and, with -api, whether the API server answers through the kubernetes
// Service with the pod's own token. It holds no GPU memory itself: there is
// no GPU; the tests write mock NVML's books for its PID as the driver would
// (tests/cluster).
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/gpufrac/gpufrac/tests/images/report"
)

// envPrefixes are the variables reported: gpufrac's, the NVIDIA toolkit's
// and CUDA's, and where the API server is.
var envPrefixes = []string{"GPUFRAC_", "NVIDIA_", "CUDA_", "KUBERNETES_SERVICE_"}

func main() {
	name := flag.String("name", "", "a name for this report (e.g. the container's)")
	sleep := flag.Duration("sleep", 0, "exit after this long (0: wait until stopped)")
	api := flag.Bool("api", false, "also GET /version from the API server with the pod's service account token")
	exitCode := flag.Int("exit-code", 0, "exit status after -sleep")
	flag.Parse()

	r := report.Report{Name: *name, PID: os.Getpid(), Env: map[string]string{}}
	r.Hostname, _ = os.Hostname()
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		for _, p := range envPrefixes {
			if strings.HasPrefix(k, p) {
				r.Env[k] = v
			}
		}
	}
	r.Devices = devices()
	r.Mounts = mounts()
	r.Cgroup = lines("/proc/self/cgroup")
	if *api {
		r.API = apiVersion()
	}
	out, _ := json.Marshal(r)
	fmt.Println(string(out))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *sleep > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *sleep)
		defer cancel()
	}
	<-ctx.Done()
	os.Exit(*exitCode)
}

func devices() []report.Device {
	paths, _ := filepath.Glob("/dev/nvidia*")
	caps, _ := filepath.Glob("/dev/nvidia-caps/*")
	paths = append(paths, caps...)
	sort.Strings(paths)
	var out []report.Device
	for _, p := range paths {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			continue
		}
		out = append(out, report.Device{
			Path:  p,
			Char:  st.Mode&syscall.S_IFMT == syscall.S_IFCHR,
			Major: uint32((st.Rdev >> 8) & 0xfff),
			Minor: uint32((st.Rdev & 0xff) | ((st.Rdev >> 12) & 0xfff00)),
		})
	}
	return out
}

// mounts lists the mount points (the fifth field of mountinfo).
func mounts() []string {
	var out []string
	for _, l := range lines("/proc/self/mountinfo") {
		if f := strings.Fields(l); len(f) > 4 {
			out = append(out, f[4])
		}
	}
	return out
}

func lines(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return []string{"error: " + err.Error()}
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

// apiVersion is "<status> <body>" of GET /version, or "error: ...".
func apiVersion() string {
	const sa = "/var/run/secrets/kubernetes.io/serviceaccount"
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	token, err := os.ReadFile(filepath.Join(sa, "token"))
	if err != nil {
		return "error: " + err.Error()
	}
	ca, err := os.ReadFile(filepath.Join(sa, "ca.crt"))
	if err != nil {
		return "error: " + err.Error()
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	req, _ := http.NewRequest(http.MethodGet, "https://"+net.JoinHostPort(host, port)+"/version", nil)
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	resp, err := client.Do(req)
	if err != nil {
		return "error: " + err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return fmt.Sprintf("%d %s", resp.StatusCode, strings.Join(strings.Fields(string(body)), " "))
}
