//go:build tools

// Package tools pins kube-score, the third-party checker the chart test runs over the rendered chart
// (unmodified upstream).
package tools

import _ "github.com/zegl/kube-score/cmd/kube-score"
