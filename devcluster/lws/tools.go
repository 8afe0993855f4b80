//go:build tools

// Package tools pins the LeaderWorkerSet controller manager this module builds.
package tools

import _ "sigs.k8s.io/lws/cmd"
