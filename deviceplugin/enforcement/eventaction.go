package enforcement

import (
	"fmt"
	"hash/fnv"
	"strings"
)

// maxActionLen is the longest action events.k8s.io/v1 takes.
const maxActionLen = 128

// EventAction is an event's action with the subject it is about appended
// ("KillProcess/main/pid-42"). client-go's tools/events folds the repeats of
// one reason and action on one object into a series that keeps the first
// note: with the subject in the action, only repeats about the same subject
// fold, and a second container, GPU or process gets its own event. A
// subject that would make the action longer than events.k8s.io's 128
// characters is hashed.
func EventAction(base string, subject ...string) string {
	if len(subject) == 0 {
		return base
	}
	s := strings.Join(subject, "/")
	if len(base)+1+len(s) <= maxActionLen {
		return base + "/" + s
	}
	return base + "/" + hashOf(s)
}

// NoteAction is EventAction with a hash of the note as the subject: events
// that say different things are different events.
func NoteAction(base, note string) string { return EventAction(base, hashOf(note)) }

func hashOf(s string) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s))
	return fmt.Sprintf("%016x", h.Sum64())
}

// maxNoteBytes is the longest note events.k8s.io/v1 takes for an event
// with an eventTime (every event tools/events writes): the API server
// refuses a longer one, and tools/events does not retry it.
const maxNoteBytes = 1024

// TruncateNote cuts note to what the API server takes, on a UTF-8 boundary,
// marking the cut.
func TruncateNote(note string) string {
	if len(note) <= maxNoteBytes {
		return note
	}
	const mark = " ..."
	cut := maxNoteBytes - len(mark)
	for cut > 0 && !utf8RuneStart(note[cut]) {
		cut--
	}
	return note[:cut] + mark
}

// utf8RuneStart tells whether b starts a UTF-8 sequence.
func utf8RuneStart(b byte) bool { return b&0xC0 != 0x80 }
