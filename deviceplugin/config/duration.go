package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
)

// MarshalJSON writes d as a Go duration string such as "1s" or "1m30s".
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(d.String())
}

// UnmarshalJSON reads a Go duration string such as "500ms" or "1s". Bare
// numbers are refused: "1" could mean nanoseconds or seconds. JSON null leaves
// d unchanged.
func (d *Duration) UnmarshalJSON(data []byte) error {
	if bytes.Equal(data, []byte("null")) {
		return nil
	}
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("reading duration %s: want a string such as \"1s\"", data)
	}
	parsed, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("reading duration: %w", err)
	}
	d.Duration = parsed
	return nil
}
