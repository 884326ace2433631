package check

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

const chartDir = "../helm/kvmesh"

// helmBin finds helm: $KVMESH_HELM, else helm on PATH. Without it the chart
// tests skip, unless KVMESH_REQUIRE_TOOLS=1 (as in .ci/run) makes that a failure.
func helmBin(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("KVMESH_HELM"); h != "" {
		return h
	}
	if h, err := exec.LookPath("helm"); err == nil {
		return h
	}
	msg := "no helm binary: set KVMESH_HELM or put helm on PATH (.ci/run builds helm.sh/helm/v4/cmd/helm from the Go proxy)"
	if os.Getenv("KVMESH_REQUIRE_TOOLS") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// render runs helm template with the given extra arguments (-f file, --set k=v).
func render(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	h := helmBin(t)
	cmd := exec.Command(h, append([]string{"template", "kvmesh", chartDir, "--namespace", "kvmesh"}, args...)...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return nil, &renderError{err: err, stderr: stderr.String()}
	}
	return out.Bytes(), nil
}

type renderError struct {
	err    error
	stderr string
}

func (e *renderError) Error() string { return e.err.Error() + ": " + strings.TrimSpace(e.stderr) }

func mustRender(t *testing.T, args ...string) []Doc {
	t.Helper()
	out, err := render(t, args...)
	if err != nil {
		t.Fatalf("helm template %v: %v", args, err)
	}
	docs, err := Decode(out)
	if err != nil {
		t.Fatalf("helm template %v: strict decode:\n%v", args, err)
	}
	return docs
}

// valueSets are the values the chart is checked with: the defaults, both
// examples, and every optional object switched on.
var valueSets = map[string][]string{
	"default":        nil,
	"pd":             {"-f", chartDir + "/examples/pd.yaml"},
	"external-nats":  {"-f", chartDir + "/examples/external-nats.yaml"},
	"monitoring-all": {"--set", "metrics.serviceMonitor.enabled=true,metrics.podMonitor.enabled=true,credentials.nats.credsSecret=c,credentials.nats.tlsSecret=t"},
	"vllm":           {"-f", chartDir + "/examples/vllm.yaml"},
	"sglang":         {"-f", chartDir + "/examples/sglang.yaml"},
	"trtllm":         {"-f", chartDir + "/examples/trtllm.yaml"},
	"vllm-pd":        {"-f", chartDir + "/examples/vllm-pd.yaml"},
	"sglang-pd":      {"-f", chartDir + "/examples/sglang.yaml", "--set", "workers[0].role=prefill,workers[1].name=dec,workers[1].role=decode,workers[1].engine=sglang,workers[1].model=meta-llama/Llama-3.1-8B-Instruct,workers[1].engineServer.image=lmsysorg/sglang:v0.5.3"},
	"trtllm-pd":      {"-f", chartDir + "/examples/trtllm.yaml", "--set", "workers[0].role=decode,workers[1].role=prefill"},
	"sim-kvbm":       {"--set", "workers[0].name=sim,workers[0].kvbm.enabled=true,workers[0].kvbm.hostBlocks=1024,workers[0].kvbm.diskBlocks=4096"},
}

func TestRenderedManifestsAreValid(t *testing.T) {
	for name, args := range valueSets {
		t.Run(name, func(t *testing.T) {
			docs := mustRender(t, args...)
			if len(docs) < 3 {
				t.Fatalf("only %d documents rendered", len(docs))
			}
			for _, e := range Review(docs) {
				t.Error(e)
			}
		})
	}
}

func find[T any](docs []Doc, name string) T {
	var zero T
	for _, d := range docs {
		if o, ok := d.Obj.(T); ok && d.Name == name {
			return o
		}
	}
	return zero
}

func TestDefaultRender(t *testing.T) {
	docs := mustRender(t)
	fe := find[*appsv1.Deployment](docs, "kvmesh-frontend")
	if fe == nil {
		t.Fatal("no kvmesh-frontend Deployment")
	}
	c := fe.Spec.Template.Spec.Containers[0]
	if c.ReadinessProbe.HTTPGet.Path != "/health" || c.LivenessProbe.HTTPGet.Path != "/live" {
		t.Errorf("frontend probes: readiness %s liveness %s, want /health and /live", c.ReadinessProbe.HTTPGet.Path, c.LivenessProbe.HTTPGet.Path)
	}
	for _, want := range []string{"frontend", "--nats=nats://kvmesh-nats.kvmesh.svc:4222", "--model=kvmesh-sim", "--router-replica-sync=false"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("frontend args %v lack %s", c.Args, want)
		}
	}
	if fe.Spec.Template.Annotations["prometheus.io/port"] != "8000" {
		t.Errorf("frontend scrape annotations: %v", fe.Spec.Template.Annotations)
	}
	w := find[*appsv1.Deployment](docs, "kvmesh-worker-sim")
	if w == nil {
		t.Fatal("no kvmesh-worker-sim Deployment")
	}
	if *w.Spec.Replicas != 2 {
		t.Errorf("worker replicas %d, want 2", *w.Spec.Replicas)
	}
	wc := w.Spec.Template.Spec.Containers[0]
	if rp, lp := wc.ReadinessProbe.HTTPGet, wc.LivenessProbe.HTTPGet; rp == nil || lp == nil || rp.Path != "/health" || lp.Path != "/live" ||
		rp.Port.StrVal != "metrics" || lp.Port.StrVal != "metrics" {
		t.Errorf("worker probes: readiness %+v liveness %+v, want /health and /live on the metrics port", rp, lp)
	}
	for _, want := range []string{"worker", "--role=aggregated", "--advertise=$(POD_IP):9000", "--advertise-host=$(POD_IP)", "--control-listen=0.0.0.0:9100", "--metrics-listen=0.0.0.0:9090"} {
		if !slices.Contains(wc.Args, want) {
			t.Errorf("worker args %v lack %s", wc.Args, want)
		}
	}
	if len(wc.Env) == 0 || wc.Env[0].Name != "POD_IP" || wc.Env[0].ValueFrom.FieldRef.FieldPath != "status.podIP" {
		t.Errorf("worker env %v: want POD_IP from status.podIP first ($(POD_IP) only expands variables defined before use)", wc.Env)
	}
	if find[*appsv1.StatefulSet](docs, "kvmesh-nats") == nil || find[*corev1.ConfigMap](docs, "kvmesh-nats") == nil {
		t.Error("no NATS StatefulSet and ConfigMap")
	}
	for _, d := range docs {
		if _, ok := d.Obj.(*ServiceMonitor); ok {
			t.Errorf("%s rendered though monitors are off by default", d)
		}
		if _, ok := d.Obj.(*PodMonitor); ok {
			t.Errorf("%s rendered though monitors are off by default", d)
		}
	}
}

func TestPDExample(t *testing.T) {
	docs := mustRender(t, valueSets["pd"]...)
	roles := map[string]string{}
	for _, d := range docs {
		dep, ok := d.Obj.(*appsv1.Deployment)
		if !ok || dep.Labels["app.kubernetes.io/component"] != "worker" {
			continue
		}
		args := dep.Spec.Template.Spec.Containers[0].Args
		for _, a := range args {
			if r, ok := strings.CutPrefix(a, "--role="); ok {
				roles[dep.Name] = r
			}
		}
		if !slices.Contains(args, "--model=llama-3-8b-sim") {
			t.Errorf("%s: args %v lack the model from workerDefaults", dep.Name, args)
		}
		if dep.Spec.Template.Spec.NodeSelector["kvmesh.io/pool"] != "gpu" || len(dep.Spec.Template.Spec.Tolerations) != 1 {
			t.Errorf("%s: nodeSelector/tolerations from workerDefaults not applied", dep.Name)
		}
	}
	if roles["kvmesh-worker-prefill"] != "prefill" || roles["kvmesh-worker-decode"] != "decode" || len(roles) != 2 {
		t.Errorf("worker roles %v, want prefill and decode groups", roles)
	}
	dec := find[*appsv1.Deployment](docs, "kvmesh-worker-decode")
	ports := dec.Spec.Template.Spec.Containers[0].Ports
	if !slices.ContainsFunc(ports, func(p corev1.ContainerPort) bool { return p.Name == "control-1" && p.ContainerPort == 9101 }) {
		t.Errorf("decode ports %v: dpSize 2 wants control-1 on 9101", ports)
	}
	// The group's sim map merges over workerDefaults' one key by key.
	if a := dec.Spec.Template.Spec.Containers[0].Args; !slices.Contains(a, "--max-seqs=512") || !slices.Contains(a, "--blocks=32768") {
		t.Errorf("decode args %v: want the group's --max-seqs and the defaults' --blocks", a)
	}
	fe := find[*appsv1.Deployment](docs, "kvmesh-frontend")
	if !slices.Contains(fe.Spec.Template.Spec.Containers[0].Args, "--router-replica-sync=true") {
		t.Error("two frontend replicas without --router-replica-sync=true")
	}
}

func TestExternalNATSExample(t *testing.T) {
	docs := mustRender(t, valueSets["external-nats"]...)
	if find[*appsv1.StatefulSet](docs, "kvmesh-nats") != nil {
		t.Error("NATS StatefulSet rendered with nats.enabled=false")
	}
	w := find[*appsv1.Deployment](docs, "kvmesh-worker-sim")
	c := w.Spec.Template.Spec.Containers[0]
	for _, want := range []string{"--nats-creds=/etc/kvmesh/nats-creds/nats.creds", "--nats-ca=/etc/kvmesh/nats-tls/ca.crt", "--nats-cert=/etc/kvmesh/nats-tls/tls.crt", "--nats-key=/etc/kvmesh/nats-tls/tls.key"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("worker args lack %s", want)
		}
	}
	if slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--control-listen") }) {
		t.Error("controlPort: 0 still renders --control-listen")
	}
	secrets := map[string]bool{}
	for _, v := range w.Spec.Template.Spec.Volumes {
		if v.Secret != nil {
			secrets[v.Secret.SecretName] = true
		}
	}
	if !secrets["kvmesh-nats-creds"] || !secrets["kvmesh-nats-tls"] {
		t.Errorf("secret volumes %v, want the two named in values", secrets)
	}
	if img := c.Image; img != "registry.example.com/kvmesh/kvmesh:0.1.0" {
		t.Errorf("image %s", img)
	}
}

// TestChartRefusesBadValues: values that would deploy something broken or
// misleading stop helm template with a message naming the value. The
// templates' own guards are checked with the schema skipped as well, since
// helm install --skip-schema-validation exists.
func TestChartRefusesBadValues(t *testing.T) {
	const noSchema = "--skip-schema-validation"
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--set", "image.tag=latest"}, "image.tag"},
		{[]string{"--set", "kvbm.enabled=true"}, "'kvbm' not allowed"},
		{[]string{"--set", "workers[0].name=sim,workers[0].kvbm.enabled=true"}, "give hostBlocks or diskBlocks"},
		{[]string{"--set", "workers[0].name=sim,workers[0].role=decode,workers[0].kvbm.enabled=true,workers[0].kvbm.hostBlocks=8"}, "decode worker runs no connector"},
		{[]string{"-f", chartDir + "/examples/vllm.yaml", "--set", "workers[0].kvbm.enabled=true,workers[0].kvbm.hostBlocks=8"}, "only trtllm"},
		{[]string{"--set", "workers[0].name=sim,workers[0].engine=vllm"}, "engineServer.image"},
		{[]string{"-f", chartDir + "/examples/trtllm.yaml", "--set", "workers[0].dpSize=2"}, "one rank"},
		{[]string{"-f", chartDir + "/examples/trtllm.yaml", "--set", "workers[0].engineServer.modelPath=/models/q"}, "leave engineServer.modelPath empty"},
		{[]string{"-f", chartDir + "/examples/vllm.yaml", "--set", "workers[0].engineServer.readinessProbe.httpGet.port=8000"}, "/readinessProbe"},
		{[]string{"--set", "nats.enabled=false"}, "nats.external.url"},
		{[]string{"--set", "workers[0].name=sim,workers[1].name=sim"}, "used twice"},
		{[]string{"--set", "frontend.replica=2"}, "'replica' not allowed"},
		{[]string{"--set", "workers[0].name=sim,workers[0].sim.blockSize=0"}, "/workers/0/sim/blockSize"},
		{[]string{"--set", "workers[0].name=sim,workers[0].role=verifier"}, "/workers/0/role"},
		{[]string{noSchema, "--set", "workers[0].name=sim,workers[0].role=verifier"}, "want aggregated, prefill or decode"},
		{[]string{"--set", "workers[0].name=sim,workers[0].engine=tgi"}, "/workers/0/engine"},
		{[]string{noSchema, "--set", "workers[0].name=sim,workers[0].engine=tgi"}, "want sim, vllm, sglang or trtllm"},
		{[]string{"--set", "workers[0].name=Bad_Name"}, "/workers/0/name"},
		{[]string{noSchema, "--set", "workers[0].name=Bad_Name"}, "DNS label"},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			_, err := render(t, c.args...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("helm template %v: err %v, want one naming %q", c.args, err, c.want)
			}
		})
	}
}

// TestReviewCatchesDefects feeds the checker manifests with one defect each:
// a checker that passes everything would pass the chart too.
func TestReviewCatchesDefects(t *testing.T) {
	out, err := render(t)
	if err != nil {
		t.Fatal(err)
	}
	base := string(out)
	cases := []struct {
		name, old, new, want string
		decode               bool // the defect is a decode error, not a review finding
	}{
		{"unknown field", "  replicas: 2\n", "  replicas: 2\n  replica: 2\n", "unknown field", true},
		{"mis-cased field", "  replicas: 2\n", "  Replicas: 2\n", "unknown field", true},
		{"duplicate key", "  replicas: 2\n", "  replicas: 2\n  replicas: 3\n", "already set", true},
		{"bad quantity", "memory: 2Gi", "memory: 2Gii", "quantit", true},
		{"secret object", "apiVersion: v1\nkind: ServiceAccount", "apiVersion: v1\nkind: Secret", "kind not expected", true},
		{"latest image", "image: kvmesh:0.1.0", "image: kvmesh:latest", "tag latest", false},
		{"untagged image", "image: kvmesh:0.1.0", "image: kvmesh", "no tag", false},
		{"no liveness probe", "livenessProbe:", "startupProbe:", "no livenessProbe", false},
		{"root", "runAsNonRoot: true", "runAsNonRoot: false", "non-root", false},
		{"no cpu request", "            cpu: 500m\n", "", "no cpu request", false},
		{"inline secret env", "        - name: POD_IP\n", "        - name: NATS_PASSWORD\n          value: hunter2\n        - name: POD_IP\n", "inline value", false},
		{"inline secret arg", "        - --log-level=info\n", "        - --log-level=info\n        - --api-key=sk-123\n", "secret inline", false},
		{"probe port typo", "            port: http\n", "            port: htp\n", "not a named port", false},
		{"service selects nothing", "    app.kubernetes.io/component: frontend\n  ports:", "    app.kubernetes.io/component: frontdoor\n  ports:", "matches no rendered pod", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(base, c.old) {
				t.Fatalf("rendered chart has no %q to mutate", c.old)
			}
			docs, err := Decode([]byte(strings.Replace(base, c.old, c.new, 1)))
			var got []error
			if err != nil {
				got = append(got, err)
			}
			if !c.decode {
				if err != nil {
					t.Fatalf("decode failed, want a review finding: %v", err)
				}
				got = Review(docs)
			}
			for _, e := range got {
				if strings.Contains(e.Error(), c.want) {
					return
				}
			}
			t.Fatalf("no error containing %q; got %v", c.want, got)
		})
	}
}

var (
	buildOnce sync.Once
	kvmeshBin string
	buildErr  error
)

// kvmeshBinary builds the kvmesh binary from the repository root once per run.
func kvmeshBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kvmesh-deploy-check")
		if err != nil {
			buildErr = err
			return
		}
		kvmeshBin = filepath.Join(dir, "kvmesh")
		cmd := exec.Command("go", "build", "-o", kvmeshBin, "./cmd/kvmesh")
		cmd.Dir = "../.."
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = &renderError{err: err, stderr: string(out)}
		}
	})
	if buildErr != nil {
		t.Fatalf("go build ./cmd/kvmesh: %v", buildErr)
	}
	return kvmeshBin
}

// TestArgsAreRealFlags: every --flag the chart passes is a flag of the
// kvmesh subcommand it runs, so a renamed flag breaks CI here, not a rollout.
func TestArgsAreRealFlags(t *testing.T) {
	bin := kvmeshBinary(t)
	helps := map[string]string{}
	checked := 0
	for name, args := range valueSets {
		for _, d := range mustRender(t, args...) {
			dep, ok := d.Obj.(*appsv1.Deployment)
			if !ok {
				continue
			}
			for _, c := range dep.Spec.Template.Spec.Containers {
				if !strings.HasPrefix(c.Image, "kvmesh:") {
					continue // an engine beside the worker: its flags are the engine's (engines_test.go)
				}
				if len(c.Args) == 0 {
					t.Errorf("%s: %s: container %s has no subcommand", name, d, c.Name)
					continue
				}
				sub := c.Args[0]
				help, ok := helps[sub]
				if !ok {
					out, err := exec.Command(bin, sub, "--help").CombinedOutput()
					if err != nil {
						t.Fatalf("kvmesh %s --help: %v\n%s", sub, err, out)
					}
					help, helps[sub] = string(out), string(out)
				}
				for _, a := range c.Args[1:] {
					flag, _, _ := strings.Cut(a, "=")
					if !strings.HasPrefix(flag, "--") || !strings.Contains(help, " "+flag+" ") {
						t.Errorf("%s: %s: kvmesh %s has no flag %s", name, d, sub, flag)
					}
					checked++
				}
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d args checked", checked)
	}
}
