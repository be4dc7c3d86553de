// Command probe is the real-node test's workload: it asks the API server,
// through the kubernetes Service (KUBERNETES_SERVICE_HOST) and with its
// ServiceAccount token, who it is (a SelfSubjectReview: any authenticated
// user may, an anonymous one may not), prints "probe: ok <status> <body>"
// or the error, and then waits for SIGTERM.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

const saDir = "/var/run/secrets/kubernetes.io/serviceaccount"

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	for attempt := 1; attempt <= 30; attempt++ {
		err := probe()
		if err == nil {
			break
		}
		fmt.Printf("probe: attempt %d: %v\n", attempt, err)
		select {
		case <-sig:
			return
		case <-time.After(time.Second):
		}
	}
	<-sig
}

func probe() error {
	token, err := os.ReadFile(saDir + "/token")
	if err != nil {
		return err
	}
	ca, err := os.ReadFile(saDir + "/ca.crt")
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return fmt.Errorf("no certificate in %s/ca.crt", saDir)
	}
	client := &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}
	url := "https://" + net.JoinHostPort(os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")) +
		"/apis/authentication.k8s.io/v1/selfsubjectreviews"
	review := `{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(review))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("POST %s: %s: %s", url, resp.Status, body)
	}
	fmt.Printf("probe: ok %d %s\n", resp.StatusCode, strings.Join(strings.Fields(string(body)), " "))
	return nil
}
