# Sourced by scripts/cuda_device.sh and scripts/tp_device.sh on a GPU machine: puts the CUDA
# libraries cudarc loads at run time on LD_LIBRARY_PATH (the toolkit's, else pip's nvidia
# wheels), and with `cuda_env_nccl` also a libnccl.so (cudarc loads libnccl.so or
# libnccl.so.<CUDA major>; pip's wheel ships libnccl.so.2 only).
pylibs=$(python3 -c 'import os, nvidia
for p in nvidia.__path__:
    for sub in sorted(os.listdir(p)):
        if os.path.isdir(os.path.join(p, sub, "lib")): print(os.path.join(p, sub, "lib"))' 2>/dev/null)
for d in /usr/local/cuda/lib64 $pylibs; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
unset pylibs

cuda_env_nccl() {
    local nccl
    nccl=$(ls /usr/lib/x86_64-linux-gnu/libnccl.so.2 /usr/local/cuda/lib64/libnccl.so.2 2>/dev/null | head -1)
    [ -n "$nccl" ] || nccl=$(python3 -c 'import nvidia, os
for p in nvidia.__path__:
    for r, _, fs in os.walk(p):
        if "libnccl.so.2" in fs: print(os.path.join(r, "libnccl.so.2")); raise SystemExit' 2>/dev/null)
    echo "libnccl: ${nccl:-not found}"
    if [ -n "$nccl" ]; then
        mkdir -p /tmp/kiln-nccl && ln -sf "$nccl" /tmp/kiln-nccl/libnccl.so
        export LD_LIBRARY_PATH="/tmp/kiln-nccl:$LD_LIBRARY_PATH"
    fi
}
