package kvcr

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestLinkerConfig(t *testing.T) {
	const opt = "advertise_host in " + ExtraConfigOption
	cases := []struct {
		name, json string
		dp         int
		want       []string
		err        string // substring; "" means success
	}{
		{"ipv4", `{"publish_inventory":true,"kvcr_service_socket_path":null,"advertise_host":"10.0.0.7","control_port":23280}`, 1, []string{"tcp://10.0.0.7:23280"}, ""},
		{"ipv6 bare is bracketed", `{"publish_inventory":true,"advertise_host":"fd00::7","control_port":23280}`, 2, []string{"tcp://[fd00::7]:23280", "tcp://[fd00::7]:23281"}, ""},
		{"ipv6 bracketed", `{"publish_inventory":true,"advertise_host":"[::1]","control_port":9}`, 1, []string{"tcp://[::1]:9"}, ""},
		{"hostname", `{"publish_inventory":true,"advertise_host":"node-3.cluster","control_port":23280,"other_kvcr_key":[1,2]}`, 1, []string{"tcp://node-3.cluster:23280"}, ""},
		{"inventory off", `{"publish_inventory":false,"advertise_host":"10.0.0.7","control_port":1}`, 1, nil, "publish_inventory in " + ExtraConfigOption},
		{"service socket", `{"publish_inventory":true,"kvcr_service_socket_path":"/run/kvcr.sock","advertise_host":"10.0.0.7","control_port":1}`, 1, nil, "kvcr_service_socket_path in " + ExtraConfigOption},
		{"no host", `{"publish_inventory":true,"control_port":23280}`, 1, nil, opt + " (and --kvcr-extra-config) is not set"},
		{"wildcard v4", `{"publish_inventory":true,"advertise_host":"0.0.0.0","control_port":23280}`, 1, nil, opt + " (and --kvcr-extra-config) \"0.0.0.0\" is a wildcard"},
		{"wildcard v6", `{"publish_inventory":true,"advertise_host":"::","control_port":23280}`, 1, nil, "is a wildcard"},
		{"wildcard v6 bracketed", `{"publish_inventory":true,"advertise_host":"[::]","control_port":23280}`, 1, nil, "is a wildcard"},
		{"v4 with port", `{"publish_inventory":true,"advertise_host":"10.0.0.7:23280","control_port":23280}`, 1, nil, "carries a port"},
		{"v6 with port unbracketed", `{"publish_inventory":true,"advertise_host":"::1:23280","control_port":23280}`, 1, nil, "must be bracketed"},
		{"v6 with port bracketed", `{"publish_inventory":true,"advertise_host":"[::1]:23280","control_port":23280}`, 1, nil, "carries a port"},
		{"no port", `{"publish_inventory":true,"advertise_host":"10.0.0.7"}`, 1, nil, "control_port in " + ExtraConfigOption},
		// All or nothing: rank 1 would be 65536, so rank 0 is not advertised either.
		{"last rank past 65535", `{"publish_inventory":true,"advertise_host":"10.0.0.7","control_port":65535}`, 2, nil, "every one of the 2 DP ranks"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			lc, err := ParseLinkerConfig(c.json)
			if err != nil {
				t.Fatal(err)
			}
			var eps []string
			if err = lc.Check(); err == nil {
				eps, err = lc.Endpoints(c.dp)
			}
			if c.err == "" {
				if err != nil || !slices.Equal(eps, c.want) {
					t.Fatalf("got %v %v, want %v", eps, err, c.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Fatalf("error %v, want one containing %q", err, c.err)
			}
			if eps != nil {
				t.Fatalf("endpoints %v advertised beside an error", eps)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error spans lines: %q", err)
			}
		})
	}
}

func TestParseLinkerConfigForms(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvcr.json")
	if err := os.WriteFile(path, []byte(`{"publish_inventory": true, "advertise_host": "10.1.1.1", "control_port": 5}`), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := ParseLinkerConfig("@" + path)
	if err != nil || c.AdvertiseHost != "10.1.1.1" || c.ControlPort != 5 || !c.PublishInventory {
		t.Fatalf("@file: %+v %v", c, err)
	}
	for _, bad := range []string{"", "[1]", "{", "@" + path + ".missing", `{"control_port":"x"}`} {
		if _, err := ParseLinkerConfig(bad); err == nil || !strings.Contains(err.Error(), ExtraConfigFlag) {
			t.Errorf("%q: %v, want an error naming %s", bad, err, ExtraConfigFlag)
		}
	}
}

func goodDescriptor() Descriptor {
	return Descriptor{CacheOwner: "owner-7", Topic: TopicFor("owner-7"), BlockSize: 16, HashDomain: HashDomainSGLang,
		Scope: ScopeProcessLocal, Media: InventoryMedia(), HintForwarding: true}
}

func TestDescriptorValidate(t *testing.T) {
	want := Expect{BlockSize: 16, HashDomain: HashDomainSGLang}
	if err := goodDescriptor().Validate(want); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		edit func(d *Descriptor, e *Expect)
		err  string
	}{
		{"no owner", func(d *Descriptor, _ *Expect) { d.CacheOwner = "" }, "no cache_owner_id"},
		{"owner pinned elsewhere", func(_ *Descriptor, e *Expect) { e.CacheOwner = "owner-8" }, "but --kvcr-cache-owner is \"owner-8\""},
		{"shared topic", func(d *Descriptor, _ *Expect) { d.Topic = "kvcr-inventory" }, "not owner-specific"},
		{"empty topic", func(d *Descriptor, _ *Expect) { d.Topic = "" }, "not owner-specific"},
		{"owner is the whole topic", func(d *Descriptor, _ *Expect) { d.Topic = "owner-7" }, "not owner-specific"},
		{"owner only as a suffix", func(d *Descriptor, _ *Expect) { d.Topic = "kvcr.xowner-7" }, "not owner-specific"},
		{"block size", func(d *Descriptor, _ *Expect) { d.BlockSize = 64 }, "block_size 64, but this worker's block size is 16"},
		{"hash domain", func(d *Descriptor, _ *Expect) { d.HashDomain = HashDomainVLLM }, "hash_domain \"vllm_sha256_u64\""},
		{"no expected domain", func(_ *Descriptor, e *Expect) { e.HashDomain = "" }, "hash_domain"},
		{"scope", func(d *Descriptor, _ *Expect) { d.Scope = "cluster" }, "inventory_scope \"cluster\""},
		{"no media", func(d *Descriptor, _ *Expect) { d.Media = nil }, "no media"},
		{"unknown medium", func(d *Descriptor, _ *Expect) { d.Media = []string{"GPU", "TAPE"} }, "medium \"TAPE\""},
		{"no hint forwarding", func(d *Descriptor, _ *Expect) { d.HintForwarding = false }, "kv_hint_forwarding is off"},
	}
	for _, c := range cases {
		d, e := goodDescriptor(), want
		c.edit(&d, &e)
		if err := d.Validate(e); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s: %v, want an error containing %q", c.name, err, c.err)
		}
	}
}

func TestTopologyGate(t *testing.T) {
	for _, ok := range []Topology{{}, {TP: 1, DP: 1, PP: 1, CP: 1, DCP: 1, NNodes: 1, TokenizerWorkers: 1}} {
		if err := ok.Gate("flags"); err != nil {
			t.Fatalf("%+v refused: %v", ok, err)
		}
	}
	cases := []struct {
		name string
		top  Topology
		line string
	}{
		{"tp", Topology{TP: 2}, "--kvcr-inventory: unsupported engine topology (flags): tensor parallel 2 (linker inventory is published at TP 1 only)"},
		{"dp", Topology{DP: 4}, "--kvcr-inventory: unsupported engine topology (flags): data parallel 4 (the inventory carries no DP rank)"},
		{"attention dp", Topology{AttentionDP: true}, "--kvcr-inventory: unsupported engine topology (flags): attention data parallel (ranks bind control ports the inventory does not name)"},
		{"cp", Topology{CP: 2}, "--kvcr-inventory: unsupported engine topology (flags): context parallel 2 (each rank holds part of a block's KV)"},
		{"dcp", Topology{DCP: 8}, "--kvcr-inventory: unsupported engine topology (flags): decode context parallel 8 (each rank holds part of a block's KV)"},
		{"pp", Topology{PP: 2}, "--kvcr-inventory: unsupported engine topology (flags): pipeline parallel 2 (each stage holds only its layers' KV)"},
		{"multi-node", Topology{NNodes: 2}, "--kvcr-inventory: unsupported engine topology (flags): 2 nodes (one host's endpoint cannot serve a multi-node engine's blocks)"},
		{"tokenizer workers", Topology{TokenizerWorkers: 4}, "--kvcr-inventory: unsupported engine topology (flags): 4 tokenizer workers (hints would reach only one of them)"},
	}
	for _, c := range cases {
		err := c.top.Gate("flags")
		if err == nil || err.Error() != c.line {
			t.Errorf("%s: %v\nwant %s", c.name, err, c.line)
		}
	}
	err := Topology{TP: 2, PP: 2}.Gate(ServerInfoPath)
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "(/get_server_info): tensor parallel 2") || !strings.Contains(err.Error(), "; pipeline parallel 2") {
		t.Fatalf("two reasons, one line, with the source: %v", err)
	}
}

func TestParseServerInfo(t *testing.T) {
	body := `{"model_path":"m","tp_size":1,"dp_size":1,"pp_size":1,"enable_dp_attention":false,"nnodes":1,"tokenizer_worker_num":1,
	 "page_size":16,"internal_states":[{"kvcr_inventory":{"cache_owner_id":"owner-7","topic":"kvcr-inventory.owner-7","block_size":16,
	 "hash_domain":"sglang_sha256_i64","inventory_scope":"process_local","media":["GPU","CPU","STORAGE"],"kv_hint_forwarding":true}}],"version":"0.5.9"}`
	si, err := ParseServerInfo([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if si.Inventory == nil || si.Inventory.Validate(Expect{BlockSize: 16, HashDomain: HashDomainSGLang}) != nil {
		t.Fatalf("inventory %+v", si.Inventory)
	}
	if si.Topology.Gate("engine") != nil {
		t.Fatalf("topology %+v", si.Topology)
	}
	si, err = ParseServerInfo([]byte(`{"tp_size":2,"dp_size":2,"enable_dp_attention":true,"attn_cp_size":2,"tokenizer_worker_num":2}`))
	if err != nil || si.Inventory != nil {
		t.Fatal(si, err)
	}
	if g := si.Topology.Gate("engine"); g == nil || !strings.Contains(g.Error(), "context parallel 2") || !strings.Contains(g.Error(), "attention data parallel") {
		t.Fatalf("engine's own topology not gated: %v", g)
	}
	if _, err := ParseServerInfo([]byte(`[]`)); err == nil {
		t.Fatal("a non-object answer must be an error")
	}
}
