package enforcement

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestEventAction(t *testing.T) {
	for _, tt := range []struct {
		name, base string
		subject    []string
		want       string
	}{
		{"no subject", "EvictPod", nil, "EvictPod"},
		{"container and pid", "KillProcess", []string{"main", "pid-42"}, "KillProcess/main/pid-42"},
		{"too long: hashed", "CheckGPUMemory", []string{strings.Repeat("c", 63), "GPU-" + strings.Repeat("0", 36), "x"}, ""},
	} {
		got := EventAction(tt.base, tt.subject...)
		if tt.want != "" && got != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
		if len(got) > maxActionLen || !strings.HasPrefix(got, tt.base) {
			t.Errorf("%s: %q (%d characters): not an action events.k8s.io takes", tt.name, got, len(got))
		}
	}
	a, b := NoteAction("LoadConfig", "bad field x"), NoteAction("LoadConfig", "bad field y")
	if a == b || a != NoteAction("LoadConfig", "bad field x") {
		t.Errorf("NoteAction: %q and %q: want one action per note, the same for the same note", a, b)
	}
}

func TestTruncateNote(t *testing.T) {
	short := "fits"
	if TruncateNote(short) != short {
		t.Error("a short note was changed")
	}
	long := strings.Repeat("é", 600) // 1,200 bytes
	got := TruncateNote(long)
	if len(got) > maxNoteBytes || !strings.HasSuffix(got, " ...") || !utf8.ValidString(got) {
		t.Errorf("truncated to %d bytes, valid UTF-8 %v, suffix %q", len(got), utf8.ValidString(got), got[len(got)-4:])
	}
}
