package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/csv"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// pki is the cluster's key material, all under one directory. One self-signed CA
// signs one serving certificate that the API server, kube-scheduler and
// kube-controller-manager all present on 127.0.0.1 (good enough for a test cluster,
// and every client can verify it with the CA).
type pki struct {
	caPEM             []byte // the CA certificate, PEM
	caFile            string
	caCert            *x509.Certificate
	caKey             *ecdsa.PrivateKey // signs client certificates (clientCert), e.g. a real node's kubelet
	servingCert       string
	servingKey        string
	saKey             string // service-account signing key (private)
	saPub             string // service-account verification key (public)
	kubeletClientCert string // the API server's client certificate to kubelets (logs, exec)
	kubeletClientKey  string
	tokenAuthFile     string // --token-auth-file CSV
	tokens            map[string]string
	serviceIPRange    string
}

// identity is a token-authenticated user of the cluster.
type identity struct {
	user   string
	groups []string
}

// identities returns the users the cluster's components and tests authenticate as,
// by component name. kube-scheduler uses its bootstrap RBAC identity; the others are
// cluster admins (kube-controller-manager runs with --use-service-account-credentials=false,
// so it needs more than its bootstrap role).
func identities() map[string]identity {
	return map[string]identity{
		"admin":                   {user: "admin", groups: []string{"system:masters"}},
		"kube-scheduler":          {user: "system:kube-scheduler"},
		"kube-controller-manager": {user: "system:kube-controller-manager", groups: []string{"system:masters"}},
		"kwok":                    {user: "kwok", groups: []string{"system:masters"}},
		"karpenter":               {user: "karpenter", groups: []string{"system:masters"}},
		"kueue":                   {user: "kueue", groups: []string{"system:masters"}},
		"kuberay-operator":        {user: "kuberay-operator", groups: []string{"system:masters"}},
	}
}

// writePKI creates the CA, the serving certificate, the service-account key pair and
// a token file with one random token per identity, all in dir.
func writePKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating pki dir: %w", err)
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating CA key: %w", err)
	}
	caSerial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	servingSerial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          caSerial,
		Subject:               pkix.Name{CommonName: "gpufrac-test-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("signing CA certificate: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("parsing CA certificate: %w", err)
	}

	servingKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating serving key: %w", err)
	}
	servingTmpl := &x509.Certificate{
		SerialNumber: servingSerial,
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local"},
		// 10.96.0.1 is the kubernetes Service's ClusterIP in serviceIPRange.
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1")},
	}
	servingDER, err := x509.CreateCertificate(rand.Reader, servingTmpl, caCert, &servingKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("signing serving certificate: %w", err)
	}

	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating service-account key: %w", err)
	}

	p := &pki{
		caPEM:          pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		caFile:         filepath.Join(dir, "ca.crt"),
		caCert:         caCert,
		caKey:          caKey,
		servingCert:    filepath.Join(dir, "serving.crt"),
		servingKey:     filepath.Join(dir, "serving.key"),
		saKey:          filepath.Join(dir, "sa.key"),
		saPub:          filepath.Join(dir, "sa.pub"),
		tokenAuthFile:  filepath.Join(dir, "tokens.csv"),
		tokens:         map[string]string{},
		serviceIPRange: "10.96.0.0/16",
	}
	servingKeyDER, err := x509.MarshalECPrivateKey(servingKey)
	if err != nil {
		return nil, fmt.Errorf("encoding serving key: %w", err)
	}
	saKeyDER, err := x509.MarshalECPrivateKey(saKey)
	if err != nil {
		return nil, fmt.Errorf("encoding service-account key: %w", err)
	}
	saPubDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("encoding service-account public key: %w", err)
	}
	files := []struct {
		path  string
		block *pem.Block
	}{
		{p.caFile, &pem.Block{Type: "CERTIFICATE", Bytes: caDER}},
		{p.servingCert, &pem.Block{Type: "CERTIFICATE", Bytes: servingDER}},
		{p.servingKey, &pem.Block{Type: "EC PRIVATE KEY", Bytes: servingKeyDER}},
		{p.saKey, &pem.Block{Type: "EC PRIVATE KEY", Bytes: saKeyDER}},
		{p.saPub, &pem.Block{Type: "PUBLIC KEY", Bytes: saPubDER}},
	}
	for _, f := range files {
		if err := os.WriteFile(f.path, pem.EncodeToMemory(f.block), 0o600); err != nil {
			return nil, fmt.Errorf("writing %s: %w", f.path, err)
		}
	}

	// The API server calls a real node's kubelet (logs, exec) as a cluster admin.
	cert, key, err := p.clientCert("kube-apiserver-kubelet-client", []string{"system:masters"})
	if err != nil {
		return nil, err
	}
	p.kubeletClientCert, p.kubeletClientKey = filepath.Join(dir, "kubelet-client.crt"), filepath.Join(dir, "kubelet-client.key")
	if err := os.WriteFile(p.kubeletClientCert, cert, 0o600); err != nil {
		return nil, fmt.Errorf("writing %s: %w", p.kubeletClientCert, err)
	}
	if err := os.WriteFile(p.kubeletClientKey, key, 0o600); err != nil {
		return nil, fmt.Errorf("writing %s: %w", p.kubeletClientKey, err)
	}

	var csvBuf strings.Builder
	w := csv.NewWriter(&csvBuf)
	for name, id := range identities() {
		token, err := randomToken()
		if err != nil {
			return nil, err
		}
		p.tokens[name] = token
		// token,user,uid,"group1,group2"
		if err := w.Write([]string{token, id.user, id.user, strings.Join(id.groups, ",")}); err != nil {
			return nil, fmt.Errorf("writing token of %s: %w", name, err)
		}
	}
	w.Flush()
	if err := w.Error(); err != nil {
		return nil, fmt.Errorf("writing token file: %w", err)
	}
	if err := os.WriteFile(p.tokenAuthFile, []byte(csvBuf.String()), 0o600); err != nil {
		return nil, fmt.Errorf("writing %s: %w", p.tokenAuthFile, err)
	}
	return p, nil
}

// randomSerial returns a random 128-bit certificate serial number.
func randomSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("generating a serial number: %w", err)
	}
	return n, nil
}

// randomToken returns 24 random bytes, hex-encoded.
func randomToken() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generating a token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// clientCert signs a client certificate for user (CN) in groups (O), as the
// API server's --client-ca-file authenticates it, and returns it and its key in
// PEM. A real node's kubelet uses one: nodes can join a running cluster, while
// the token file is read once at the API server's start.
func (p *pki) clientCert(user string, groups []string) (certPEM, keyPEM []byte, err error) {
	return signCert(&x509.Certificate{
		Subject:     pkix.Name{CommonName: user, Organization: groups},
		NotAfter:    p.caCert.NotAfter,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, p.caCert, p.caKey)
}

// loopbackServingCert signs a serving certificate for 127.0.0.1 and localhost
// with the cluster CA, so the API server, which trusts that CA (caPEM as a
// webhook's caBundle), can call a server on the loopback address, and
// returns it and its key in PEM.
func (p *pki) loopbackServingCert(cn string) (certPEM, keyPEM []byte, err error) {
	return signCert(loopbackServing(cn, p.caCert.NotAfter), p.caCert, p.caKey)
}

// loopbackServing is the template of a serving certificate for 127.0.0.1
// and localhost.
func loopbackServing(cn string, notAfter time.Time) *x509.Certificate {
	return &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		NotAfter:    notAfter,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
}

// signCert makes a P-256 key and a certificate of tmpl (its subject, end,
// usage and names; serial, start and key usage are filled here) signed by
// parent's key, or self-signed when parent is nil, and returns both in PEM.
func signCert(tmpl *x509.Certificate, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (certPEM, keyPEM []byte, err error) {
	cn := tmpl.Subject.CommonName
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating key of %s: %w", cn, err)
	}
	if tmpl.SerialNumber, err = randomSerial(); err != nil {
		return nil, nil, err
	}
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		return nil, nil, fmt.Errorf("signing certificate of %s: %w", cn, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding key of %s: %w", cn, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}
