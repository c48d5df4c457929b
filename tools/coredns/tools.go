//go:build tools

// Package tools pins CoreDNS, the cluster DNS of the local stack's node (unmodified upstream main).
package tools

import (
	_ "github.com/coredns/coredns"
)
