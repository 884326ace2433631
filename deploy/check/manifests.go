package check

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Doc is one rendered manifest, decoded into its typed object.
type Doc struct {
	Source string // the template it came from ("kvmesh/templates/nats.yaml")
	Kind   string // "apps/v1/Deployment"
	Name   string
	Obj    any
}

func (d Doc) String() string { return d.Kind + " " + d.Name + " (" + d.Source + ")" }

// kinds are the objects the chart may render. A Secret is deliberately
// absent: credentials are mounted from Secrets that exist beforehand.
var kinds = map[string]func() any{
	"apps/v1/Deployment":                      func() any { return &appsv1.Deployment{} },
	"apps/v1/StatefulSet":                     func() any { return &appsv1.StatefulSet{} },
	"v1/Service":                              func() any { return &corev1.Service{} },
	"v1/ConfigMap":                            func() any { return &corev1.ConfigMap{} },
	"v1/ServiceAccount":                       func() any { return &corev1.ServiceAccount{} },
	"monitoring.coreos.com/v1/ServiceMonitor": func() any { return &ServiceMonitor{} },
	"monitoring.coreos.com/v1/PodMonitor":     func() any { return &PodMonitor{} },
}

// Decode splits helm template output into documents and decodes each one
// strictly: YAML duplicate keys, unknown or mis-cased fields, wrong types and
// malformed quantities are errors, as an API server's strict field
// validation would report them.
func Decode(manifests []byte) ([]Doc, error) {
	r := k8syaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifests)))
	var docs []Doc
	var errs []error
	for {
		raw, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		src := sourceOf(raw)
		j, err := yaml.YAMLToJSONStrict(raw)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", src, err))
			continue
		}
		if bytes.Equal(bytes.TrimSpace(j), []byte("null")) {
			continue // only comments
		}
		var tm struct {
			metav1.TypeMeta
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := sigsjson.UnmarshalCaseSensitivePreserveInts(j, &tm); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", src, err))
			continue
		}
		kind := tm.APIVersion + "/" + tm.Kind
		mk, ok := kinds[kind]
		if !ok {
			errs = append(errs, fmt.Errorf("%s: %s %s: kind not expected from this chart (a Secret never is: credentials come from existing Secrets)", src, kind, tm.Metadata.Name))
			continue
		}
		obj := mk()
		strict, err := sigsjson.UnmarshalStrict(j, obj, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %s %s: %w", src, kind, tm.Metadata.Name, err))
			continue
		}
		for _, e := range strict {
			errs = append(errs, fmt.Errorf("%s: %s %s: %w", src, kind, tm.Metadata.Name, e))
		}
		docs = append(docs, Doc{Source: src, Kind: kind, Name: tm.Metadata.Name, Obj: obj})
	}
	return docs, errors.Join(errs...)
}

func sourceOf(raw []byte) string {
	for _, l := range strings.Split(string(raw), "\n") {
		if s, ok := strings.CutPrefix(strings.TrimSpace(l), "# Source: "); ok {
			return s
		}
	}
	return "(no source)"
}

// ServiceMonitor and PodMonitor hold the Prometheus Operator (v1) fields the
// chart renders, with the operator's JSON names. The operator's own Go types
// would pull its module and its Kubernetes pins in for two small objects, so
// these are checked strictly against the subset the chart uses: a field the
// chart adds must be added here, on purpose.
type ServiceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []MonitorEndpoint    `json:"endpoints"`
	} `json:"spec"`
}

type PodMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector            metav1.LabelSelector `json:"selector"`
		PodMetricsEndpoints []MonitorEndpoint    `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

type MonitorEndpoint struct {
	Port        string `json:"port"`
	Path        string `json:"path"`
	Interval    string `json:"interval"`
	Relabelings []struct {
		SourceLabels []string `json:"sourceLabels"`
		TargetLabel  string   `json:"targetLabel"`
	} `json:"relabelings,omitempty"`
}

// podTemplate is a workload's pod template with the workload it came from.
type podTemplate struct {
	doc      Doc
	selector *metav1.LabelSelector
	tmpl     *corev1.PodTemplateSpec
	claims   []corev1.PersistentVolumeClaim
}

func podTemplates(docs []Doc) []podTemplate {
	var out []podTemplate
	for _, d := range docs {
		switch o := d.Obj.(type) {
		case *appsv1.Deployment:
			out = append(out, podTemplate{d, o.Spec.Selector, &o.Spec.Template, nil})
		case *appsv1.StatefulSet:
			out = append(out, podTemplate{d, o.Spec.Selector, &o.Spec.Template, o.Spec.VolumeClaimTemplates})
		}
	}
	return out
}

var (
	secretName = regexp.MustCompile(`(?i)(^|[-_])(password|passwd|secret|token|api[-_]?key|private[-_]?key|creds|credentials?)$`)
	pemBlock   = regexp.MustCompile(`-----BEGIN [A-Z ]*(PRIVATE KEY|CERTIFICATE)-----`)
	natsSeed   = regexp.MustCompile(`\bSU[A-Z2-7]{56}\b`) // an NKey user seed
)

// Review reports what a reviewer would reject in the decoded manifests.
func Review(docs []Doc) []error {
	var errs []error
	bad := func(d Doc, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", d, fmt.Sprintf(format, a...)))
	}
	pods := podTemplates(docs)
	for _, d := range docs {
		m := objectMeta(d.Obj)
		for _, e := range validation.IsDNS1123Subdomain(m.Name) {
			bad(d, "name: %s", e)
		}
		if m.Namespace != "" {
			bad(d, "namespace %q set in the manifest: leave it to helm --namespace", m.Namespace)
		}
		errs = append(errs, checkLabels(d, m.Labels)...)
		switch o := d.Obj.(type) {
		case *corev1.Service:
			for _, e := range validation.IsDNS1035Label(o.Name) {
				bad(d, "service name: %s", e)
			}
			errs = append(errs, checkService(d, o, pods)...)
		case *corev1.ConfigMap:
			for k, v := range o.Data {
				if pemBlock.MatchString(v) || natsSeed.MatchString(v) {
					bad(d, "data[%s] holds key material: mount it from a Secret", k)
				}
			}
		case *ServiceMonitor:
			errs = append(errs, checkMonitor(d, &o.Spec.Selector, o.Spec.Endpoints, docs, false)...)
		case *PodMonitor:
			errs = append(errs, checkMonitor(d, &o.Spec.Selector, o.Spec.PodMetricsEndpoints, docs, true)...)
		}
	}
	for _, p := range pods {
		errs = append(errs, checkPod(p)...)
	}
	return errs
}

func objectMeta(o any) metav1.ObjectMeta {
	switch o := o.(type) {
	case *appsv1.Deployment:
		return o.ObjectMeta
	case *appsv1.StatefulSet:
		return o.ObjectMeta
	case *corev1.Service:
		return o.ObjectMeta
	case *corev1.ConfigMap:
		return o.ObjectMeta
	case *corev1.ServiceAccount:
		return o.ObjectMeta
	case *ServiceMonitor:
		return o.ObjectMeta
	case *PodMonitor:
		return o.ObjectMeta
	}
	return metav1.ObjectMeta{}
}

func checkLabels(d Doc, l map[string]string) []error {
	var errs []error
	for k, v := range l {
		for _, e := range validation.IsQualifiedName(k) {
			errs = append(errs, fmt.Errorf("%s: label key %q: %s", d, k, e))
		}
		for _, e := range validation.IsValidLabelValue(v) {
			errs = append(errs, fmt.Errorf("%s: label %s=%q: %s", d, k, v, e))
		}
	}
	return errs
}

func checkPod(p podTemplate) []error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", p.doc, fmt.Sprintf(format, a...)))
	}
	sel, err := metav1.LabelSelectorAsSelector(p.selector)
	switch {
	case p.selector == nil || err != nil || sel.Empty():
		bad("selector missing or invalid (%v)", err)
	case !sel.Matches(labels.Set(p.tmpl.Labels)):
		bad("selector %s does not match the pod template's labels %v", sel, p.tmpl.Labels)
	}
	errs = append(errs, checkLabels(p.doc, p.tmpl.Labels)...)
	spec := &p.tmpl.Spec
	psc := spec.SecurityContext
	volumes := map[string]bool{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = true
		if v.Secret != nil && v.Secret.SecretName == "" {
			bad("volume %s: secret without a name", v.Name)
		}
	}
	for _, c := range p.claims {
		volumes[c.Name] = true
		if _, ok := c.Spec.Resources.Requests[corev1.ResourceStorage]; !ok {
			bad("volumeClaimTemplate %s: no storage request", c.Name)
		}
	}
	if len(spec.Containers) == 0 {
		bad("no containers")
	}
	for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
		cbad := func(format string, a ...any) { bad("container %s: %s", c.Name, fmt.Sprintf(format, a...)) }
		if e := imageProblem(c.Image); e != "" {
			cbad("image %q: %s", c.Image, e)
		}
		ports := map[string]int32{}
		for _, pt := range c.Ports {
			if pt.Name == "" {
				continue
			}
			for _, e := range validation.IsValidPortName(pt.Name) {
				cbad("port name %q: %s", pt.Name, e)
			}
			if _, dup := ports[pt.Name]; dup {
				cbad("port name %q used twice", pt.Name)
			}
			ports[pt.Name] = pt.ContainerPort
		}
		for name, pr := range map[string]*corev1.Probe{"readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe} {
			if pr == nil {
				cbad("no %s", name)
				continue
			}
			if e := probeProblem(pr, ports); e != "" {
				cbad("%s: %s", name, e)
			}
		}
		if c.StartupProbe != nil {
			if e := probeProblem(c.StartupProbe, ports); e != "" {
				cbad("startupProbe: %s", e)
			}
		}
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if q, ok := c.Resources.Requests[r]; !ok || q.IsZero() {
				cbad("no %s request", r)
			}
		}
		if q, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok || q.IsZero() {
			cbad("no memory limit")
		} else if req := c.Resources.Requests[corev1.ResourceMemory]; q.Cmp(req) < 0 {
			cbad("memory limit %s below its request %s", q.String(), req.String())
		}
		if !nonRoot(psc, c.SecurityContext) {
			cbad("not guaranteed to run as non-root (runAsNonRoot true, runAsUser not 0)")
		}
		sc := c.SecurityContext
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			cbad("allowPrivilegeEscalation is not false")
		}
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			cbad("root filesystem is not read-only")
		}
		if sc == nil || sc.Capabilities == nil || !dropsAll(sc.Capabilities.Drop) {
			cbad("capabilities do not drop ALL")
		}
		for _, e := range c.Env {
			if e.Value != "" && (secretName.MatchString(e.Name) && !strings.HasPrefix(e.Value, "/") || pemBlock.MatchString(e.Value) || natsSeed.MatchString(e.Value)) {
				cbad("env %s has an inline value: take it from a Secret (valueFrom or a mounted file)", e.Name)
			}
		}
		for _, a := range append(append([]string{}, c.Command...), c.Args...) {
			name, val, ok := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if strings.HasPrefix(a, "--") && ok && secretName.MatchString(name) && !strings.HasPrefix(val, "/") {
				cbad("arg %s carries a secret inline: pass a mounted file's path", name)
			}
			if pemBlock.MatchString(a) || natsSeed.MatchString(a) {
				cbad("an argument holds key material")
			}
		}
		for _, m := range c.VolumeMounts {
			if !volumes[m.Name] {
				cbad("volumeMount %s names no volume", m.Name)
			}
		}
	}
	return errs
}

// imageProblem says why an image reference is not pinned, or "".
func imageProblem(img string) string {
	if img == "" {
		return "empty"
	}
	if strings.Contains(img, "@sha256:") {
		return ""
	}
	last := img[strings.LastIndex(img, "/")+1:]
	_, tag, ok := strings.Cut(last, ":")
	switch {
	case !ok || tag == "":
		return "no tag (means latest): pin a version or a digest"
	case tag == "latest":
		return "tag latest: pin a version or a digest"
	}
	return ""
}

func probeProblem(p *corev1.Probe, ports map[string]int32) string {
	n := 0
	var port *struct{ name string }
	h := p.ProbeHandler
	if h.HTTPGet != nil {
		n++
		if h.HTTPGet.Path == "" || !strings.HasPrefix(h.HTTPGet.Path, "/") {
			return "httpGet without an absolute path"
		}
		port = portRef(h.HTTPGet.Port.StrVal)
	}
	if h.TCPSocket != nil {
		n++
		port = portRef(h.TCPSocket.Port.StrVal)
	}
	if h.GRPC != nil {
		n++
	}
	if h.Exec != nil {
		n++
	}
	if n != 1 {
		return fmt.Sprintf("%d handlers, want exactly one", n)
	}
	if port != nil {
		if _, ok := ports[port.name]; !ok {
			return fmt.Sprintf("port %q is not a named port of the container", port.name)
		}
	}
	return ""
}

func portRef(name string) *struct{ name string } {
	if name == "" {
		return nil // numeric port
	}
	return &struct{ name string }{name}
}

func nonRoot(pod *corev1.PodSecurityContext, c *corev1.SecurityContext) bool {
	var runAsNonRoot *bool
	var uid *int64
	if pod != nil {
		runAsNonRoot, uid = pod.RunAsNonRoot, pod.RunAsUser
	}
	if c != nil {
		if c.RunAsNonRoot != nil {
			runAsNonRoot = c.RunAsNonRoot
		}
		if c.RunAsUser != nil {
			uid = c.RunAsUser
		}
	}
	return runAsNonRoot != nil && *runAsNonRoot && (uid == nil || *uid != 0)
}

func dropsAll(caps []corev1.Capability) bool {
	for _, c := range caps {
		if c == "ALL" {
			return true
		}
	}
	return false
}

// checkService: the selector must pick a rendered pod template, and every
// named targetPort must be a port of its containers.
func checkService(d Doc, s *corev1.Service, pods []podTemplate) []error {
	var errs []error
	if len(s.Spec.Selector) == 0 {
		return []error{fmt.Errorf("%s: no selector", d)}
	}
	sel := labels.SelectorFromSet(s.Spec.Selector)
	var matched []podTemplate
	for _, p := range pods {
		if sel.Matches(labels.Set(p.tmpl.Labels)) {
			matched = append(matched, p)
		}
	}
	if len(matched) == 0 {
		return []error{fmt.Errorf("%s: selector %s matches no rendered pod template", d, sel)}
	}
	for _, sp := range s.Spec.Ports {
		if name := sp.TargetPort.StrVal; name != "" {
			for _, p := range matched {
				if !hasPort(p.tmpl, name) {
					errs = append(errs, fmt.Errorf("%s: targetPort %q is not a container port of %s", d, name, p.doc))
				}
			}
		}
	}
	return errs
}

func hasPort(t *corev1.PodTemplateSpec, name string) bool {
	for _, c := range t.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == name {
				return true
			}
		}
	}
	return false
}

// checkMonitor: the selector must pick a rendered Service (ServiceMonitor)
// or pod template (PodMonitor) that has the endpoint's named port.
func checkMonitor(d Doc, ls *metav1.LabelSelector, eps []MonitorEndpoint, docs []Doc, pods bool) []error {
	sel, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil || sel.Empty() {
		return []error{fmt.Errorf("%s: selector missing or invalid (%v)", d, err)}
	}
	if len(eps) == 0 {
		return []error{fmt.Errorf("%s: no endpoints", d)}
	}
	var errs []error
	found := false
	for _, o := range docs {
		if pods {
			for _, p := range podTemplates([]Doc{o}) {
				if sel.Matches(labels.Set(p.tmpl.Labels)) {
					found = true
					for _, ep := range eps {
						if !hasPort(p.tmpl, ep.Port) {
							errs = append(errs, fmt.Errorf("%s: port %q is not a container port of %s", d, ep.Port, p.doc))
						}
					}
				}
			}
		} else if s, ok := o.Obj.(*corev1.Service); ok && sel.Matches(labels.Set(s.Labels)) {
			found = true
			for _, ep := range eps {
				ok := false
				for _, sp := range s.Spec.Ports {
					ok = ok || sp.Name == ep.Port
				}
				if !ok {
					errs = append(errs, fmt.Errorf("%s: port %q is not a port of %s", d, ep.Port, o))
				}
			}
		}
	}
	if !found {
		errs = append(errs, fmt.Errorf("%s: selector %s matches nothing rendered", d, sel))
	}
	return errs
}
