//go:build tools

// Package tools pins the Kubeflow Spark Operator: its controller/webhook command, and (from the same
// module) the CRDs and the Helm chart the local stack installs it with.
package tools

import (
	_ "github.com/kubeflow/spark-operator/v2/cmd/operator"
)
