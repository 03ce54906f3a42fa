"""emu_source.py DIR - rewrite the CUDA sources copied into DIR for the CPU
emulation of CUDA (emu_runtime.cpp): kernel<<<cfg>>>(args) becomes
emu_launch(kernel, emu_cfg(cfg), args), and a dynamic shared-memory array
becomes the emulated block's buffer. Used by run_emu.sh and
tests/backend/test_model_emu.sh."""
import glob
import re
import sys

for p in glob.glob(sys.argv[1] + "/*.cu"):
    s = open(p).read()
    s = re.sub(r"(\w+)<<<(.*?)>>>\(", r"emu_launch(\1, emu_cfg(\2), ", s, flags=re.S)
    s = re.sub(r"extern __shared__ float (\w+)\[\];", r"float *\1 = (float *)emu_dyn_shared();", s)
    open(p, "w").write(s)
