package release

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"strings"
	"testing"
	"time"
)

// TestCrossCCSaysWhatIsMissing checks the reasons the dry run gives for
// leaving gpufrac-node's linux/arm64 out (release.json's notBuilt) instead of
// failing: no compiler given, a compiler not on PATH, an unknown architecture.
func TestCrossCCSaysWhatIsMissing(t *testing.T) {
	tests := []struct {
		name string
		ccs  map[string]string
		arch string
		want string
	}{
		{"none given", nil, "arm64", "no C cross compiler for arm64 was given"},
		{"another architecture's only", map[string]string{"amd64": "x86_64-linux-gnu-gcc"}, "arm64", "no C cross compiler for arm64 was given"},
		{"not on PATH", map[string]string{"arm64": "gpufrac-no-such-gcc"}, "arm64", "the C cross compiler gpufrac-no-such-gcc is not on PATH (Debian's gcc-aarch64-linux-gnu, libc6-dev-arm64-cross and libc6-arm64-cross"},
		{"unknown architecture", map[string]string{"s390x": "gcc"}, "s390x", `architecture "s390x"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cc, missing := crossCC(tc.ccs, tc.arch)
			if cc != "" || !strings.Contains(missing, tc.want) {
				t.Errorf("crossCC = %q, %q; want no compiler and a reason saying %q", cc, missing, tc.want)
			}
		})
	}
}

// helmLikeTgz is a chart package as helm package writes it: Helm's gzip
// comment and extra field, the files in Helm's order, each stamped with at.
func helmLikeTgz(t *testing.T, files [][2]string, at time.Time) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Comment, zw.Extra = "Helm", []byte("+aHR0cHM6Ly95b3V0dS5iZS96OVV6MWljandyTQo=Helm")
	tw := tar.NewWriter(zw)
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: f[0], Mode: 0o644, Size: int64(len(f[1])), ModTime: at}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(f[1])); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestReproducibleChartPackage checks that two packages of the same files
// made at different times become the same bytes, with Helm's entries, order,
// modes, contents and gzip comment and extra field kept and every time the
// source date, which checkTgzTimes accepts (and refuses Helm's own times).
func TestReproducibleChartPackage(t *testing.T) {
	files := [][2]string{
		{"gpufrac/Chart.yaml", "apiVersion: v2\nname: gpufrac\nversion: 0.1.0\n"},
		{"gpufrac/values.yaml", "node: {}\n"},
		{"gpufrac/templates/a.yaml", "kind: A\n"},
		{"gpufrac/README.md", "# gpufrac\n"},
	}
	date := time.Date(2026, 11, 29, 15, 0, 0, 0, time.UTC)
	first := helmLikeTgz(t, files, time.Date(2026, 11, 29, 16, 1, 2, 0, time.UTC))
	second := helmLikeTgz(t, files, time.Date(2026, 11, 29, 16, 3, 4, 0, time.UTC))
	if bytes.Equal(first, second) {
		t.Fatal("the two inputs are the same bytes: the test cannot tell anything")
	}
	if err := checkTgzTimes(first, date.Format(time.RFC3339)); err == nil || !strings.Contains(err.Error(), "not reproducible") {
		t.Errorf("checkTgzTimes accepted Helm's packaging time: %v", err)
	}
	a, err := Reproducible(first, date)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Reproducible(second, date.Add(500*time.Millisecond)) // sub-second dropped
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatal("Reproducible gave different bytes for the same files packaged at different times")
	}
	if err := checkTgzTimes(a, date.Format(time.RFC3339)); err != nil {
		t.Errorf("checkTgzTimes: %v", err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(a))
	if err != nil {
		t.Fatal(err)
	}
	if zr.Comment != "Helm" || !bytes.HasSuffix(zr.Extra, []byte("Helm")) {
		t.Errorf("gzip comment %q, extra %q: want Helm's kept", zr.Comment, zr.Extra)
	}
	tr := tar.NewReader(zr)
	for i := 0; ; i++ {
		h, err := tr.Next()
		if err == io.EOF {
			if i != len(files) {
				t.Errorf("%d entries, want %d", i, len(files))
			}
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		if i >= len(files) || h.Name != files[i][0] || string(data) != files[i][1] || h.Mode != 0o644 || !h.ModTime.Equal(date) {
			t.Errorf("entry %d: %s mode %o at %s %q, want %v mode 644 at %s", i, h.Name, h.Mode, h.ModTime, data, files[min(i, len(files)-1)], date)
		}
	}
	if _, err := Reproducible([]byte("not gzip"), date); err == nil {
		t.Error("Reproducible accepted something that is not gzip")
	}
}
