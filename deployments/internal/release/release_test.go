package release

import (
	"strings"
	"testing"
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
