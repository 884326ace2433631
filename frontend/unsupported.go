package frontend

import "strings"

// UnsupportedParameter is one request parameter the frontend answers with
// a 400 unsupported_parameter (never ignores): Name, and When, the values
// refused ("" any value but the default).
type UnsupportedParameter struct {
	Name, When string
	// Example is a request body fragment refused on Endpoint: "chat",
	// "completions" or "" (both).
	Endpoint, Example string
}

// UnsupportedParameters are the frontend's refusals, one entry per
// parameter given to unsupported() in request.go; the README lists them
// (UnsupportedList), and a test keeps the three equal.
var UnsupportedParameters = []UnsupportedParameter{
	{"n", "> 1", "", `"n":2`},
	{"logprobs", "", "chat", `"logprobs":true`},
	{"best_of", "> 1", "completions", `"best_of":2,"n":1`},
	{"tools", "unless `tool_choice` is `\"none\"`", "chat", `"tools":[{"type":"function","function":{"name":"f"}}]`},
	{"functions", "", "chat", `"functions":[{"name":"f"}]`},
	{"function_call", "other than `\"none\"` or `\"auto\"`", "chat", `"function_call":{"name":"f"}`},
	{"response_format", "other than text", "chat", `"response_format":{"type":"json_object"}`},
	{"modalities", "other than text", "chat", `"modalities":["audio"]`},
	{"audio", "", "chat", `"audio":{}`},
	{"prediction", "", "chat", `"prediction":{}`},
	{"web_search_options", "", "chat", `"web_search_options":{}`},
	{"reasoning_effort", "", "chat", `"reasoning_effort":"low"`},
	{"logit_bias", "", "", `"logit_bias":{"1":5}`},
	{"suffix", "", "completions", `"suffix":"x"`},
}

// UnsupportedList is the README's list of the refused parameters, in the
// table's order: `n` > 1, `logprobs`, ….
func UnsupportedList() string {
	parts := make([]string, len(UnsupportedParameters))
	for i, p := range UnsupportedParameters {
		parts[i] = "`" + p.Name + "`"
		if p.When != "" {
			parts[i] += " " + p.When
		}
	}
	return strings.Join(parts, ", ")
}
