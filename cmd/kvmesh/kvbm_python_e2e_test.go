package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/natsbus/natstest"
)

// debianPython is the interpreter the connector's Python tests run under:
// Debian's, which sees python3-numpy (a pyenv one on PATH may not).
const debianPython = "/usr/bin/python3"

// pythonWithNumpy returns Debian's python3 if it imports numpy, else skips
// naming what is missing (a failure under KVMESH_REQUIRE_TOOLS=1).
func pythonWithNumpy(t *testing.T) string {
	t.Helper()
	if out, err := exec.Command(debianPython, "-c", "import numpy").CombinedOutput(); err != nil {
		missingTool(t, "no "+debianPython+" with numpy (apt-get install python3 python3-numpy): "+strings.TrimSpace(string(out))+" "+err.Error())
	}
	return debianPython
}

// The kvmesh_kvbm package (python/) imports with the standard library
// alone: no numpy, torch or engine is loaded until a worker registers.
func TestKVBMPythonImportsStdlibOnly(t *testing.T) {
	py := pythonWithNumpy(t)
	cmd := exec.Command(py, "-S", "-c", `import sys
import kvmesh_kvbm.trtllm, kvmesh_kvbm.vllm
for c in ("kvmesh_kvbm.trtllm.KvmeshConnectorScheduler", "kvmesh_kvbm.trtllm.KvmeshConnectorWorker", "kvmesh_kvbm.vllm.KvmeshConnector"):
    mod, name = c.rsplit(".", 1)
    getattr(sys.modules[mod], name)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("numpy", "torch", "vllm", "tensorrt_llm"))
assert not heavy, heavy
print("ok")`)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+pythonDir(t))
	if out, err := cmd.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("%v\n%s", err, out)
	}
}

func pythonDir(t *testing.T) string {
	t.Helper()
	d, err := filepath.Abs("../../python")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// The connector package driven with each engine's call sequences (chunked
// prefill, preemption, async onboarding, a request finishing while it
// offloads, TensorRT-LLM's context-only and generation-only requests,
// host and disk round trips, a disk block corrupted in its pool file, a
// killed and a stalled sidecar) against real
// `kvmesh worker --connector kvbm` sidecars, which the tests start and
// kill themselves: python/tests.
func TestKVBMPythonConnector(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	py := pythonWithNumpy(t)
	ns := natstest.Start(t)
	vllm := startMockVLLM(t, "vllm mock")
	trt := startMockTRTLLM(t, "trtllm mock")()
	cmd := exec.Command(py, "-m", "unittest", "discover", "-s", filepath.Join(pythonDir(t), "tests"), "-v")
	cmd.Env = append(os.Environ(), "PYTHONPATH="+pythonDir(t), "KVMESH_BIN="+testutil.Binary(t), "KVMESH_TEST_NATS="+ns.URL(),
		"KVMESH_TEST_VLLM_URL="+vllm.url, "KVMESH_TEST_TRTLLM_URL="+trt.url, "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	t.Logf("python/tests:\n%s", out)
	if err != nil {
		t.Fatal(err)
	}
}
