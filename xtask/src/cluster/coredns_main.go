// The CoreDNS of `cargo xtask cluster`: upstream's main (coredns.go) with only the plugins
// the cluster's Corefile (coredns.yaml) names, instead of core/plugin's full list, whose
// cloud backends (route53, azure, clouddns) pull three cloud SDKs into the build. A
// Corefile directive missing here fails CoreDNS's start ("Unknown directive"); the order
// plugins run in is core/dnsserver's, not this list's. Written as main.go of the wrapper
// module by xtask/src/cluster/gobuild.rs.
package main

import (
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"

	"github.com/coredns/coredns/coremain"
)

func main() {
	coremain.Run()
}
