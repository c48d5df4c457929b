//go:build tools

// Package tools pins Kueue, the job queueing controller the tests admit Transform runs through
// (unmodified upstream cmd/kueue, built with its own go.mod's versions: no replace directives there).
package tools

import (
	_ "sigs.k8s.io/kueue/cmd/kueue"
)
