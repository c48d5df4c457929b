//go:build tools

// Package tools builds FerretDB v1 from a wrapper module: built from its own module path,
// FerretDB panics at start because its version file is not in the module zip.
package tools

import _ "github.com/FerretDB/FerretDB/cmd/ferretdb"
