"""The two bundles of benchmarks/README.md's `--draft mtp` table, in /tmp/mtpbench: the tests'
tiny Qwen3.5 with its `mtp.*` head (tests/test_mtp.py), as is ("random") and with the head
set to draft the target's bigram continuation of the quoting prompt ("bigram").

    PYTHONPATH=$PWD:$PWD/tests python benchmarks/mtp_tiny_bundles.py
"""
import sys
from pathlib import Path
sys.path.insert(0, "tests")
import test_mtp as tm
from safetensors.torch import load_file, save_file
from ssmport.exporter.pipeline import export
from ssmport.runtime.runner import Runner
root = Path("/tmp/mtpbench"); root.mkdir(exist_ok=True)
base = export(str(tm.write_mtp_checkpoint(root / "ck")), root, progress=False, quant="fp32", gate=False, verify=8, context=256, name="qwen35-mtp-random", overwrite=True)
w = {n: t.double().numpy() for n, t in load_file(str(root / "ck" / "model.safetensors")).items()}
sys.path.insert(0, "benchmarks")
from speculative import QUOTING
from ssmport.gate.run import bundle_tokenizer
with Runner(base.path) as r:
    prompt = bundle_tokenizer(r.bundle).encode(QUOTING)
    plain = list(r.generate(prompt, 96))
f = tm.write_mtp_checkpoint(root / "ck2")
t = load_file(str(f / "model.safetensors")) | tm._bigram_head(w, prompt + plain)
save_file({k: v.contiguous() for k, v in t.items()}, str(f / "model.safetensors"), metadata={"format": "pt"})
u = export(str(f), root, progress=False, quant="fp32", gate=False, verify=8, context=256, name="qwen35-mtp-bigram", overwrite=True)
print(base.path, u.path)
