//go:build tools

// Package tools pins the JobSet controller manager this module builds.
package tools

import _ "sigs.k8s.io/jobset"
