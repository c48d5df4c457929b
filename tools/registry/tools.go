//go:build tools

// The stack's OCI registry is CNCF Distribution's own command, unmodified; this file pins its module.
package tools

import _ "github.com/distribution/distribution/v3/cmd/registry"
