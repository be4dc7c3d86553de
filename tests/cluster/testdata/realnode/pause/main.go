// Command pause is a minimal pod sandbox process for the real-node test: it
// waits for SIGTERM or SIGINT and exits.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}
