package check

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// enginePod is one real-engine worker pod as rendered: the engine
// container and the kvmesh worker sidecar beside it.
type enginePod struct {
	dep            *appsv1.Deployment
	engine, worker corev1.Container
}

// enginePods returns the worker Deployments that run a real engine.
func enginePods(t *testing.T, docs []Doc) []enginePod {
	t.Helper()
	var pods []enginePod
	for _, d := range docs {
		dep, ok := d.Obj.(*appsv1.Deployment)
		if !ok || dep.Labels["app.kubernetes.io/component"] != "worker" {
			continue
		}
		var p enginePod
		p.dep = dep
		for _, c := range dep.Spec.Template.Spec.Containers {
			switch c.Name {
			case "engine":
				p.engine = c
			case "worker":
				p.worker = c
			}
		}
		if p.engine.Name == "" {
			continue
		}
		if p.worker.Name == "" {
			t.Fatalf("%s: an engine container without the kvmesh worker sidecar", dep.Name)
		}
		pods = append(pods, p)
	}
	return pods
}

// argValue is the value of --name=value in args, and whether it is there.
func argValue(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// Each example renders, per worker group, an engine container that asks
// for nvidia.com/gpu beside a `kvmesh worker` sidecar with --engine E and
// a localhost engine URL, KV events from the engine on localhost, and the
// engine's own flags for what kvmesh needs of it.
func TestEngineExamples(t *testing.T) {
	for _, c := range []struct {
		values, engine string
		groups         int
	}{
		{"vllm", "vllm", 1}, {"sglang", "sglang", 1}, {"trtllm", "trtllm", 2}, {"vllm-pd", "vllm", 2},
	} {
		t.Run(c.values, func(t *testing.T) {
			pods := enginePods(t, mustRender(t, valueSets[c.values]...))
			if len(pods) != c.groups {
				t.Fatalf("%d real-engine worker groups, want %d", len(pods), c.groups)
			}
			for _, p := range pods {
				e, w := p.engine, p.worker
				gpus := e.Resources.Limits["nvidia.com/gpu"]
				if gpus.IsZero() || !gpus.Equal(e.Resources.Requests["nvidia.com/gpu"]) {
					t.Errorf("%s: engine resources %v: want nvidia.com/gpu requested and limited", p.dep.Name, e.Resources)
				}
				if len(w.Args) == 0 || w.Args[0] != "worker" || !strings.HasPrefix(w.Image, "kvmesh:") {
					t.Errorf("%s: sidecar %s %v is not kvmesh worker", p.dep.Name, w.Image, w.Args)
				}
				if v, _ := argValue(w.Args, "engine"); v != c.engine {
					t.Errorf("%s: sidecar --engine=%q, want %s", p.dep.Name, v, c.engine)
				}
				url, _ := argValue(w.Args, "engine-url")
				port := "8000"
				if url != "http://127.0.0.1:"+port {
					t.Errorf("%s: sidecar --engine-url=%q, want the engine on localhost", p.dep.Name, url)
				}
				if v, _ := argValue(e.Args, "port"); v != port {
					t.Errorf("%s: engine --port=%q, want the port the sidecar dials", p.dep.Name, v)
				}
				events, _ := argValue(w.Args, "kv-events")
				switch c.engine {
				case "trtllm":
					if events != url {
						t.Errorf("%s: --kv-events=%q, want the engine's URL (TensorRT-LLM's events are polled)", p.dep.Name, events)
					}
				default:
					if events != "tcp://127.0.0.1:5557" {
						t.Errorf("%s: --kv-events=%q, want the engine's ZMQ publisher on localhost", p.dep.Name, events)
					}
					cfg, _ := argValue(e.Args, "kv-events-config")
					var kc struct{ Publisher, Endpoint string }
					if err := json.Unmarshal([]byte(cfg), &kc); err != nil || kc.Publisher != "zmq" || kc.Endpoint != "tcp://*:5557" {
						t.Errorf("%s: engine --kv-events-config=%s (%v): want a zmq publisher bound on 5557", p.dep.Name, cfg, err)
					}
				}
				if e.ReadinessProbe == nil || e.ReadinessProbe.Exec == nil || !strings.Contains(strings.Join(e.ReadinessProbe.Exec.Command, " "), "127.0.0.1:"+port+"/health") {
					t.Errorf("%s: engine readiness probe %+v: want its /health on localhost", p.dep.Name, e.ReadinessProbe)
				}
				shm := false
				for _, v := range p.dep.Spec.Template.Spec.Volumes {
					if v.EmptyDir != nil && v.EmptyDir.Medium == corev1.StorageMediumMemory && v.EmptyDir.SizeLimit != nil {
						shm = slices.ContainsFunc(e.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == v.Name && m.MountPath == "/dev/shm" })
					}
				}
				if !shm {
					t.Errorf("%s: no sized memory emptyDir at the engine's /dev/shm", p.dep.Name)
				}
			}
		})
	}
}

// The P/D roles carry each engine's own disaggregation flags.
func TestEngineDisaggregation(t *testing.T) {
	byGroup := func(values string) map[string]enginePod {
		m := map[string]enginePod{}
		for _, p := range enginePods(t, mustRender(t, valueSets[values]...)) {
			m[p.dep.Labels["kvmesh.io/worker-group"]] = p
		}
		return m
	}
	t.Run("vllm", func(t *testing.T) {
		for name, p := range byGroup("vllm-pd") {
			if v, _ := argValue(p.engine.Args, "kv-transfer-config"); !strings.Contains(v, `"kv_connector":"NixlConnector"`) {
				t.Errorf("%s: engine --kv-transfer-config=%q, want NixlConnector", name, v)
			}
			env := map[string]string{}
			for _, e := range p.engine.Env {
				env[e.Name] = e.Value
			}
			if env["VLLM_NIXL_SIDE_CHANNEL_HOST"] != "$(POD_IP)" || env["VLLM_NIXL_SIDE_CHANNEL_PORT"] != "5600" {
				t.Errorf("%s: NIXL side channel env %v: want the pod IP, port 5600", name, env)
			}
			if v, _ := argValue(p.worker.Args, "role"); v != name {
				t.Errorf("%s: sidecar --role=%q", name, v)
			}
		}
	})
	t.Run("sglang", func(t *testing.T) {
		g := byGroup("sglang-pd")
		pre, dec := g["llama"], g["dec"]
		if v, _ := argValue(pre.engine.Args, "disaggregation-mode"); v != "prefill" {
			t.Errorf("prefill engine --disaggregation-mode=%q", v)
		}
		if v, _ := argValue(dec.engine.Args, "disaggregation-mode"); v != "decode" {
			t.Errorf("decode engine --disaggregation-mode=%q", v)
		}
		if v, _ := argValue(pre.engine.Args, "disaggregation-bootstrap-port"); v != "8998" {
			t.Errorf("prefill engine --disaggregation-bootstrap-port=%q", v)
		}
		// The prefill's bootstrap host is its engine URL's host: the pod IP.
		if v, _ := argValue(pre.worker.Args, "engine-url"); v != "http://$(POD_IP):8000" {
			t.Errorf("prefill sidecar --engine-url=%q, want the pod IP (decode engines dial it for the bootstrap)", v)
		}
		if v, _ := argValue(dec.worker.Args, "engine-url"); v != "http://127.0.0.1:8000" {
			t.Errorf("decode sidecar --engine-url=%q", v)
		}
		fe := find[*appsv1.Deployment](mustRender(t, valueSets["sglang-pd"]...), "kvmesh-frontend")
		if !slices.Contains(fe.Spec.Template.Spec.Containers[0].Args, "--disagg-local-prefill-tokens=0") {
			t.Error("frontend before SGLang decode workers without --disagg-local-prefill-tokens=0")
		}
	})
	t.Run("trtllm", func(t *testing.T) {
		docs := mustRender(t, valueSets["trtllm-pd"]...)
		cm := find[*corev1.ConfigMap](docs, "kvmesh-worker-qwen-engine")
		if cm == nil || !strings.Contains(cm.Data["llm-api-options.yaml"], "cache_transceiver_config:\n  backend: DEFAULT") ||
			!strings.Contains(cm.Data["llm-api-options.yaml"], "event_buffer_max_size: 1024") {
			t.Fatalf("decode group's LLM API options: %+v", cm)
		}
		// The kvbm group's options are the worker's: written to a volume
		// both containers mount, which the engine reads.
		p := byGroup("trtllm-pd")["qwen-kvbm"]
		out, _ := argValue(p.worker.Args, "connector-config-out")
		opts, _ := argValue(p.engine.Args, "extra_llm_api_options")
		if out == "" || out != opts || !slices.Contains(p.worker.Args, "--connector=kvbm") || !slices.Contains(p.worker.Args, "--kvbm-host-blocks=4096") {
			t.Errorf("kvbm group: sidecar %v, engine options %q", p.worker.Args, opts)
		}
		mounted := func(c corev1.Container) string {
			for _, m := range c.VolumeMounts {
				if strings.HasPrefix(out, m.MountPath+"/") {
					return m.Name
				}
			}
			return ""
		}
		if v := mounted(p.worker); v == "" || v != mounted(p.engine) {
			t.Errorf("the connector options %s are not on a volume both containers mount", out)
		}
	})
}
