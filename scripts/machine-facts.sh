# Sourced by scripts/accuracy-vs-llamacpp.sh and scripts/bench-vs-llamacpp.sh: what a comparison
# with llama.cpp records about the machine and the peer's build.
# machine_facts <llama.cpp bin dir>: sets cpu (the CPU model), load (the load average now) and
# peer_isa (the x86 options llama.cpp was built with, from the CMakeCache.txt of its build
# directory, the bin directory's parent; "unknown" without one).
machine_facts() {
    cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//' || true)
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    local cache
    cache=$(dirname "$(realpath "$1")")/CMakeCache.txt
    peer_isa=$( [ -f "$cache" ] &&
        grep -E '^GGML_(NATIVE|AVX|AVX2|AVX_VNNI|FMA|F16C|AVX512|AVX512_VNNI|AVX512_VBMI|AVX512_BF16):BOOL=' "$cache" |
        sed 's/:BOOL=/=/' | paste -sd' ' || echo unknown)
}
