//go:build tools

// Package tools pins the Kubeflow Trainer v2 controller manager this module builds.
package tools

import _ "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"
