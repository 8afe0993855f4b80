// Command etcd is etcd's own server, built from go.etcd.io/etcd/server/v3 at the
// version k8s.io/kubernetes pins, so the test cluster runs the etcd it was released with.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
