// Command pause is the pod sandbox process of the local stack's node: it holds the pod's namespaces,
// reaps orphaned children (it is PID 1 of the pod when the process namespace is shared) and exits on
// SIGTERM or SIGINT. Built static from this file alone, so the node never pulls a registry's pause image.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
