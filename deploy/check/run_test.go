package check

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestNATSConfigParses feeds the rendered nats.conf to nats-server's own
// config parser: JetStream on, the limits from values, the ports the
// Services point at.
func TestNATSConfigParses(t *testing.T) {
	docs := mustRender(t, "--set", "nats.jetstream.maxMemoryStore=300Mi,nats.jetstream.maxFileStore=3Gi")
	cm := find[*corev1.ConfigMap](docs, "kvmesh-nats")
	if cm == nil {
		t.Fatal("no kvmesh-nats ConfigMap")
	}
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(path, []byte(cm.Data["nats.conf"]), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("POD_NAME", "kvmesh-nats-0") // the StatefulSet sets it from metadata.name
	o, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("nats-server rejects the rendered config: %v\n%s", err, cm.Data["nats.conf"])
	}
	if !o.JetStream || o.StoreDir != "/data/jetstream" {
		t.Errorf("JetStream %v store %q, want on in /data/jetstream (the PVC)", o.JetStream, o.StoreDir)
	}
	if o.JetStreamMaxMemory != 300<<20 || o.JetStreamMaxStore != 3<<30 {
		t.Errorf("JetStream limits %d/%d, want 300Mi/3Gi", o.JetStreamMaxMemory, o.JetStreamMaxStore)
	}
	if o.ServerName != "kvmesh-nats-0" || o.Port != 4222 || o.HTTPPort != 8222 {
		t.Errorf("server %q port %d monitor %d", o.ServerName, o.Port, o.HTTPPort)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expand does Kubernetes' $(VAR) expansion of command and args.
func expand(s string, env map[string]string) string {
	return varRef.ReplaceAllStringFunc(s, func(m string) string {
		if v, ok := env[m[2:len(m)-1]]; ok {
			return v
		}
		return m
	})
}

// process is a container of the rendered chart run as a local process.
type process struct {
	name  string
	cmd   *exec.Cmd
	ports map[string]int32
	c     corev1.Container
	log   *bytes.Buffer
}

// start runs the container's args with the kvmesh binary, its env as the
// only KVMESH_* settings and POD_IP as 127.0.0.1.
func start(t *testing.T, bin string, d *appsv1.Deployment) *process {
	t.Helper()
	c := d.Spec.Template.Spec.Containers[0]
	env := map[string]string{}
	var environ []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KVMESH_") {
			environ = append(environ, kv)
		}
	}
	for _, e := range c.Env {
		v := e.Value
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP" {
			v = "127.0.0.1"
		}
		env[e.Name] = expand(v, env)
		environ = append(environ, e.Name+"="+env[e.Name])
	}
	var args []string
	for _, a := range c.Args {
		args = append(args, expand(a, env))
	}
	p := &process{name: d.Name, cmd: exec.Command(bin, args...), ports: map[string]int32{}, c: c, log: &bytes.Buffer{}}
	for _, port := range c.Ports {
		p.ports[port.Name] = port.ContainerPort
	}
	p.cmd.Env = environ
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- p.cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-done
			t.Errorf("%s did not stop within 10s of SIGTERM", p.name)
		}
		if t.Failed() {
			t.Logf("%s %s:\n%s", p.name, strings.Join(args, " "), p.log)
		}
	})
	return p
}

// probe runs a rendered probe once against the local process.
func (p *process) probe(pr *corev1.Probe) error {
	port := func(name string, num int32) int32 {
		if name != "" {
			return p.ports[name]
		}
		return num
	}
	switch h := pr.ProbeHandler; {
	case h.HTTPGet != nil:
		url := fmt.Sprintf("http://127.0.0.1:%d%s", port(h.HTTPGet.Port.StrVal, h.HTTPGet.Port.IntVal), h.HTTPGet.Path)
		resp, err := http.Get(url)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 { // the kubelet's success range
			return fmt.Errorf("GET %s: %s", url, resp.Status)
		}
	case h.TCPSocket != nil:
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port(h.TCPSocket.Port.StrVal, h.TCPSocket.Port.IntVal)), time.Second)
		if err != nil {
			return err
		}
		c.Close()
	default:
		return fmt.Errorf("probe kind not run here")
	}
	return nil
}

func (p *process) waitProbe(t *testing.T, what string, pr *corev1.Probe) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := p.probe(pr)
		if err == nil {
			return
		}
		if p.cmd.ProcessState != nil || time.Now().After(deadline) {
			t.Fatalf("%s %s never passed: %v\n%s", p.name, what, err, p.log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRenderedFleetServes runs the chart's rendered command lines — one
// worker, one frontend — as local processes against a real NATS server with
// JetStream, gates on the rendered readiness and liveness probes, sends a
// chat completion through the frontend, and scrapes every target the
// Prometheus job finds.
func TestRenderedFleetServes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes; skipped in -short")
	}
	bin := kvmeshBinary(t)
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	set := fmt.Sprintf("nats.enabled=false,nats.external.url=%s,frontend.port=%d,workerDefaults.grpcPort=%d,"+
		"workerDefaults.controlPort=%d,workerDefaults.metricsPort=%d,workers[0].name=sim,workers[0].replicas=1,"+
		"workerDefaults.sim.speedupRatio=0,workerDefaults.sim.blocks=1024",
		ns.ClientURL(), freePort(t), freePort(t), freePort(t), freePort(t))
	docs := mustRender(t, "--set", set)
	wd, fd := find[*appsv1.Deployment](docs, "kvmesh-worker-sim"), find[*appsv1.Deployment](docs, "kvmesh-frontend")
	if wd == nil || fd == nil {
		t.Fatal("worker or frontend Deployment not rendered")
	}

	w := start(t, bin, wd)
	w.waitProbe(t, "readiness", w.c.ReadinessProbe)
	w.waitProbe(t, "liveness", w.c.LivenessProbe)
	f := start(t, bin, fd)
	f.waitProbe(t, "liveness", f.c.LivenessProbe)
	f.waitProbe(t, "readiness", f.c.ReadinessProbe) // /health: 200 once the worker is discovered

	body := `{"model":"kvmesh-sim","messages":[{"role":"user","content":"Hello from the chart test"}],"max_tokens":8}`
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", f.ports["http"]), strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || json.Unmarshal(raw, &out) != nil || len(out.Choices) != 1 || out.Usage.CompletionTokens == 0 {
		t.Fatalf("chat completion: %s %s", resp.Status, raw)
	}

	// Every scrape target of the Kubernetes job, with 127.0.0.1 as pod IP.
	targets, err := ScrapeTargets(kubernetesJob(t), docs, "kvmesh", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	wantSeries := map[string]string{"frontend": "kvmesh_frontend_requests_total", "worker": "kvmesh_worker_requests_total"}
	if len(targets) != len(wantSeries) {
		t.Fatalf("scrape targets %+v, want one frontend and one worker", targets)
	}
	for _, s := range targets {
		series := wantSeries[s.Labels["component"]]
		n, err := countSeries(s.URL, series)
		if err != nil || n == 0 {
			t.Errorf("scrape %s (%s): %d %s series, err %v", s.URL, s.Labels["component"], n, series, err)
		}
	}
}

// countSeries scrapes url and counts the samples of the metric name.
func countSeries(url, name string) (int, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return 0, fmt.Errorf("%s", resp.Status)
	}
	n := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, name+"{") || strings.HasPrefix(l, name+" ") {
			if _, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64); err == nil {
				n++
			}
		}
	}
	return n, sc.Err()
}
