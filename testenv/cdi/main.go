// cdi-inject applies CDI devices to an OCI runtime spec with the CDI library that
// container runtimes use (containerd >= 1.7, CRI-O), and prints the result. The tests
// check with it what such a runtime would give a container for Tessera's claim specs,
// where the real node's runtime (containerd 1.6) applies no CDI.
//
//	cdi-inject --spec-dir DIR gpu.tessera.io/claim=<uid> ...
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

func main() {
	dir := flag.String("spec-dir", "/var/run/cdi", "folder of CDI spec files")
	flag.Parse()
	cache, err := cdi.NewCache(cdi.WithSpecDirs(*dir), cdi.WithAutoRefresh(false))
	if err != nil {
		fail("reading %s: %v", *dir, err)
	}
	bad := false
	for path, errs := range cache.GetErrors() {
		for _, e := range errs {
			fmt.Fprintf(os.Stderr, "cdi-inject: %s: %v\n", path, e)
			bad = true
		}
	}
	if bad {
		os.Exit(1)
	}
	spec := &oci.Spec{
		Version: oci.Version,
		Process: &oci.Process{Env: []string{"PATH=/usr/bin:/bin"}},
		Linux:   &oci.Linux{},
	}
	if unresolved, err := cache.InjectDevices(spec, flag.Args()...); err != nil {
		fail("%v (unresolved: %v)", err, unresolved)
	}
	if err := json.NewEncoder(os.Stdout).Encode(spec); err != nil {
		fail("%v", err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "cdi-inject: "+format+"\n", args...)
	os.Exit(1)
}
