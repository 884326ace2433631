package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// tojsonFilter replaces gonja's tojson with the output transformers' chat
// templates get from Python: json.dumps(x, ensure_ascii=False) with ", " and
// ": " separators (or indent=N), no HTML escaping. Go maps have no order, so
// their keys are sorted; gonja dicts keep their order.
func tojsonFilter(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	indent := -1
	if v, ok := params.KwArgs["indent"]; ok && !v.IsNil() {
		if !v.IsInteger() {
			return exec.AsValue(exec.ErrInvalidCall(fmt.Errorf("tojson: indent must be an integer")))
		}
		indent = v.Integer()
	}
	var b bytes.Buffer
	if err := writePyJSON(&b, in.Interface(), indent, 0); err != nil {
		return exec.AsValue(exec.ErrInvalidCall(err))
	}
	return exec.AsSafeValue(b.String())
}

func writePyJSON(b *bytes.Buffer, v any, indent, depth int) error {
	newline := func(d int) {
		if indent >= 0 {
			b.WriteByte('\n')
			b.WriteString(strings.Repeat(" ", indent*d))
		}
	}
	sep := ", "
	if indent >= 0 {
		sep = ","
	}
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
		return nil
	case *exec.Value:
		return writePyJSON(b, x.Interface(), indent, depth)
	case *exec.Dict:
		if len(x.Pairs) == 0 {
			b.WriteString("{}")
			return nil
		}
		b.WriteByte('{')
		for i, p := range x.Pairs {
			if i > 0 {
				b.WriteString(sep)
			}
			newline(depth + 1)
			writeJSONString(b, p.Key.String())
			b.WriteString(": ")
			if err := writePyJSON(b, p.Value, indent, depth+1); err != nil {
				return err
			}
		}
		newline(depth)
		b.WriteByte('}')
		return nil
	case string:
		writeJSONString(b, x)
		return nil
	case bool, int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64, float32, float64, json.Number:
		j, err := json.Marshal(x)
		if err != nil {
			return err
		}
		b.Write(j)
		return nil
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Map:
		keys := make([]string, 0, rv.Len())
		vals := make(map[string]reflect.Value, rv.Len())
		for it := rv.MapRange(); it.Next(); {
			k := fmt.Sprint(it.Key().Interface())
			keys = append(keys, k)
			vals[k] = it.Value()
		}
		sort.Strings(keys)
		if len(keys) == 0 {
			b.WriteString("{}")
			return nil
		}
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteString(sep)
			}
			newline(depth + 1)
			writeJSONString(b, k)
			b.WriteString(": ")
			if err := writePyJSON(b, vals[k].Interface(), indent, depth+1); err != nil {
				return err
			}
		}
		newline(depth)
		b.WriteByte('}')
		return nil
	case reflect.Slice, reflect.Array:
		if rv.Len() == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i := 0; i < rv.Len(); i++ {
			if i > 0 {
				b.WriteString(sep)
			}
			newline(depth + 1)
			if err := writePyJSON(b, rv.Index(i).Interface(), indent, depth+1); err != nil {
				return err
			}
		}
		newline(depth)
		b.WriteByte(']')
		return nil
	case reflect.Pointer:
		if rv.IsNil() {
			b.WriteString("null")
			return nil
		}
		return writePyJSON(b, rv.Elem().Interface(), indent, depth)
	}
	j, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("tojson: %w", err)
	}
	b.Write(j)
	return nil
}

// writeJSONString quotes s like Python's json.dumps(ensure_ascii=False).
func writeJSONString(b *bytes.Buffer, s string) {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)       // a string always encodes
	b.Truncate(b.Len() - 1) // Encode appends a newline
}
