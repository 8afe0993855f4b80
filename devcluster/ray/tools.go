//go:build tools

// Package tools pins the KubeRay operator this module builds.
package tools

import _ "github.com/ray-project/kuberay/ray-operator"
