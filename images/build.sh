#!/bin/sh
# Builds kpulse's binaries for one architecture inside the Containerfile's build stage:
#   images/build.sh <amd64|arm64> <out dir>
# 1. the eBPF object, as `cargo xtask build-ebpf --release` builds it on a host (the same
#    flags; xtask/tests/manifests.rs checks that they agree);
# 2. kpulse-agent (embedding that object) and kpulse-aggregator-api for the architecture's
#    GNU/Linux target: natively when it is the build machine's, otherwise with
#    -Z build-std and that architecture's gcc as linker and C compiler.
# The toolchain is the Containerfile's (Debian's rustc 1.96 pair, bpf-linker on PATH).
set -eu
usage() { echo "usage: images/build.sh <amd64|arm64> <out dir>" >&2; exit 2; }
[ $# -eq 2 ] || usage
case "$1" in
    amd64) triple=x86_64-unknown-linux-gnu ;;
    arm64) triple=aarch64-unknown-linux-gnu ;;
    *) echo "images/build.sh: kpulse's images are built for amd64 or arm64, not '$1'" >&2; exit 2 ;;
esac
out=$2
target_dir=$(pwd)/target
# -Z build-std with Debian's stable rustc.
export RUSTC_BOOTSTRAP=1

# 1. The eBPF object: BPF bytecode, the same for every architecture (docs/design/toolchain.md).
sep=$(printf '\037')
(
    cd ebpf
    CARGO_ENCODED_RUSTFLAGS="--cfg=bpf_target_arch=\"x86_64\"${sep}-Cdebuginfo=2${sep}-Clink-arg=--btf" \
        cargo build --locked --release -Z build-std=core --target bpfel-unknown-none \
        --target-dir "$target_dir"
)
install -D -m 0644 "$target_dir/bpfel-unknown-none/release/kpulse" "$out/kpulse.bpf.o"

# 2. The binaries.
host=$(rustc -vV | sed -n 's/^host: //p')
if [ "$triple" = "$host" ]; then
    build_std=
else
    build_std="-Z build-std=std,panic_abort,panic_unwind"
fi
# Linker, C compiler and archiver for both triples, whichever is built: cargo links the
# build scripts and proc macros for the build machine with its triple's linker, and a setting
# that differed between the two builds would rebuild all of them each time.
for t in x86_64-unknown-linux-gnu:x86_64-linux-gnu aarch64-unknown-linux-gnu:aarch64-linux-gnu; do
    t_triple=${t%%:*} t_gnu=${t#*:}
    t_upper=$(echo "$t_triple" | tr 'a-z-' 'A-Z_')
    t_lower=$(echo "$t_triple" | tr '-' '_')
    export "CARGO_TARGET_${t_upper}_LINKER=${t_gnu}-gcc" "CC_${t_lower}=${t_gnu}-gcc" "AR_${t_lower}=${t_gnu}-ar"
done
# shellcheck disable=SC2086 # build_std is two words or none
KPULSE_EBPF_OBJECT="$out/kpulse.bpf.o" \
    cargo build --locked --release $build_std --target "$triple" \
    -p kpulse-agent -p kpulse-aggregator-api
for bin in kpulse-agent kpulse-aggregator-api; do
    install -D -m 0755 "$target_dir/$triple/release/$bin" "$out/$bin"
done
