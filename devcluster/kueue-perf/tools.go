//go:build tools

// Package tools pins Kueue's scheduler performance runner and minimalkueue, which
// `phalanx bench compare` builds and runs beside `phalanx bench e2e`.
package tools

import (
	_ "sigs.k8s.io/kueue/test/performance/scheduler/minimalkueue"
	_ "sigs.k8s.io/kueue/test/performance/scheduler/runner"
)
