package check

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// ScrapeConfig is the part of a Prometheus configuration file the kvmesh
// scrape jobs use. Prometheus's own config package would pull the whole
// server (and every service discovery SDK) into this module; the fields are
// decoded strictly so a misspelt key fails here instead of being ignored.
type ScrapeConfig struct {
	Global        map[string]any `json:"global,omitempty"`
	ScrapeConfigs []ScrapeJob    `json:"scrape_configs"`
}

type ScrapeJob struct {
	JobName             string          `json:"job_name"`
	ScrapeInterval      string          `json:"scrape_interval,omitempty"`
	MetricsPath         string          `json:"metrics_path,omitempty"`
	KubernetesSDConfigs []KubernetesSD  `json:"kubernetes_sd_configs,omitempty"`
	StaticConfigs       []StaticConfig  `json:"static_configs,omitempty"`
	RelabelConfigs      []RelabelConfig `json:"relabel_configs,omitempty"`
}

type KubernetesSD struct {
	Role       string `json:"role"`
	Namespaces *struct {
		Names []string `json:"names"`
	} `json:"namespaces,omitempty"`
}

type StaticConfig struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels,omitempty"`
}

type RelabelConfig struct {
	SourceLabels []string `json:"source_labels,omitempty"`
	Separator    *string  `json:"separator,omitempty"`
	Regex        *string  `json:"regex,omitempty"`
	TargetLabel  string   `json:"target_label,omitempty"`
	Replacement  *string  `json:"replacement,omitempty"`
	Action       string   `json:"action,omitempty"`
}

// LoadScrapeConfig reads and strictly decodes a Prometheus configuration file.
func LoadScrapeConfig(path string) (*ScrapeConfig, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	j, err := yaml.YAMLToJSONStrict(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var c ScrapeConfig
	strict, err := sigsjson.UnmarshalStrict(j, &c, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err == nil && len(strict) > 0 {
		err = strict[0]
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &c, nil
}

// Relabel applies relabel rules with Prometheus's semantics for the actions
// the kvmesh jobs use (replace, keep, drop): source label values joined by
// the separator (";"), the regex fully anchored (RE2, as in Prometheus),
// replacement "$1" by default, and an empty result deleting the label. It
// returns nil when the target is dropped.
func Relabel(lset map[string]string, rules []RelabelConfig) (map[string]string, error) {
	out := make(map[string]string, len(lset))
	for k, v := range lset {
		out[k] = v
	}
	for i, r := range rules {
		sep, reStr, repl := ";", "(.*)", "$1"
		if r.Separator != nil {
			sep = *r.Separator
		}
		if r.Regex != nil {
			reStr = *r.Regex
		}
		if r.Replacement != nil {
			repl = *r.Replacement
		}
		re, err := regexp.Compile("^(?s:" + reStr + ")$")
		if err != nil {
			return nil, fmt.Errorf("relabel rule %d: regex %q: %w", i, reStr, err)
		}
		vals := make([]string, len(r.SourceLabels))
		for j, l := range r.SourceLabels {
			vals[j] = out[l]
		}
		val := strings.Join(vals, sep)
		switch action := cmpOr(r.Action, "replace"); action {
		case "keep":
			if !re.MatchString(val) {
				return nil, nil
			}
		case "drop":
			if re.MatchString(val) {
				return nil, nil
			}
		case "replace":
			if r.TargetLabel == "" {
				return nil, fmt.Errorf("relabel rule %d: replace without target_label", i)
			}
			m := re.FindStringSubmatchIndex(val)
			if m == nil {
				continue
			}
			res := string(re.ExpandString(nil, repl, val, m))
			if res == "" {
				delete(out, r.TargetLabel)
			} else {
				out[r.TargetLabel] = res
			}
		default:
			return nil, fmt.Errorf("relabel rule %d: action %q not simulated here", i, action)
		}
	}
	return out, nil
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// PodTargets is what kubernetes_sd (role: pod) discovers for one pod: a
// target per declared container port (or one bare address without ports),
// labelled with the pod's meta labels.
func PodTargets(p podTemplate, namespace, podName, podIP string) []map[string]string {
	base := map[string]string{
		"__meta_kubernetes_namespace": namespace,
		"__meta_kubernetes_pod_name":  podName,
		"__meta_kubernetes_pod_ip":    podIP,
		"__meta_kubernetes_pod_phase": "Running",
		"__metrics_path__":            "/metrics",
		"__scheme__":                  "http",
	}
	for k, v := range p.tmpl.Labels {
		base["__meta_kubernetes_pod_label_"+sanitize(k)] = v
	}
	for k, v := range p.tmpl.Annotations {
		base["__meta_kubernetes_pod_annotation_"+sanitize(k)] = v
	}
	var out []map[string]string
	for _, c := range p.tmpl.Spec.Containers {
		for _, port := range c.Ports {
			t := maps(base)
			t["__address__"] = podIP + ":" + strconv.Itoa(int(port.ContainerPort))
			t["__meta_kubernetes_pod_container_name"] = c.Name
			t["__meta_kubernetes_pod_container_port_name"] = port.Name
			out = append(out, t)
		}
	}
	if len(out) == 0 {
		t := maps(base)
		t["__address__"] = podIP
		out = append(out, t)
	}
	return out
}

var nonLabel = regexp.MustCompile(`[^a-zA-Z0-9_]`)

func sanitize(s string) string { return nonLabel.ReplaceAllString(s, "_") }

func maps(m map[string]string) map[string]string {
	o := make(map[string]string, len(m)+3)
	for k, v := range m {
		o[k] = v
	}
	return o
}

// Scrape is one target after relabelling: its URL and public labels.
type Scrape struct {
	URL    string
	Labels map[string]string
}

// ScrapeTargets runs a job's relabelling over the rendered pods (each given
// podIP) and returns the distinct targets Prometheus would scrape.
func ScrapeTargets(job ScrapeJob, docs []Doc, namespace, podIP string) ([]Scrape, error) {
	seen := map[string]bool{}
	var out []Scrape
	for _, p := range podTemplates(docs) {
		for _, t := range PodTargets(p, namespace, p.doc.Name+"-0", podIP) {
			r, err := Relabel(t, job.RelabelConfigs)
			if err != nil {
				return nil, err
			}
			if r == nil {
				continue
			}
			s := Scrape{URL: r["__scheme__"] + "://" + r["__address__"] + r["__metrics_path__"], Labels: map[string]string{}}
			var key []string
			for k, v := range r {
				if !strings.HasPrefix(k, "__") {
					s.Labels[k] = v
					key = append(key, k+"="+v)
				}
			}
			slices.Sort(key)
			k := s.URL + "|" + strings.Join(key, ",")
			if !seen[k] {
				seen[k] = true
				out = append(out, s)
			}
		}
	}
	return out, nil
}
