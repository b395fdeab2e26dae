"""What `ssmport bench` derives from a bundle, checked against the model's own dimensions."""

from __future__ import annotations

import math

from ssmport.bench import measure_read_bandwidth, state_bytes, weight_bytes_per_token
from ssmport.bundle import Bundle, dir_bytes
from ssmport.exporter.pipeline import export


def test_weight_bytes_per_token_reads_one_embedding_row(pth_fp32_bundle, blinkdl_pth, tmp_path):
    m = Bundle.open(pth_fp32_bundle.path).manifest
    stored = sum(e["bytes"] for e in m.plan_tensors)
    vocab, width = m.config["vocab_size"], m.config["hidden_size"]
    # fp32: the whole plan once, except the [vocab, C] table, of which one row is read.
    assert weight_bytes_per_token(m) == stored - vocab * width * 4 + width * 4
    # and the plan is the asset: a decode-only asset is the plan within its container overhead
    decode_only = export(str(blinkdl_pth), tmp_path, quant="fp32", gate=False, progress=False, prefill_chunk=None)
    assert 0.95 < stored / dir_bytes(decode_only.path / "model.aimodel") <= 1.0
    # the prefill function shares those weights and adds only its chunk's masks ([T, T] and
    # [H, T, T] constants), not a second copy
    T, heads = m.prefill.chunk, width // m.config["head_size"]
    added = dir_bytes(pth_fp32_bundle.path / "model.aimodel") - dir_bytes(decode_only.path / "model.aimodel")
    assert 0 < added < 8 * T * T * 4 * (1 + heads) < stored / 2


def test_state_bytes_from_the_config(pth_fp32_bundle):
    c = Bundle.open(pth_fp32_bundle.path).manifest.config
    heads = c["hidden_size"] // c["head_size"]
    rec = c["num_layers"] * heads * c["head_size"] * (c["value_head_size"] or c["head_size"])
    shift = c["num_layers"] * 2 * c["hidden_size"]
    assert state_bytes(Bundle.open(pth_fp32_bundle.path).manifest) == 4 * (rec + shift)


def test_read_bandwidth_is_plausible():
    gbps = measure_read_bandwidth(64 << 20, repeats=2)
    assert 0.5 < gbps < 1000 and math.isfinite(gbps)


def test_page_in_reads_every_file_of_the_loaded_model(pth_fp32_bundle):
    from ssmport.runtime import Runner, lowered_path

    bundle = Bundle.open(pth_fp32_bundle.path)
    with Runner(bundle) as runner:
        before = runner.step(1)
        assert runner.page_in() == dir_bytes(lowered_path(bundle)) > bundle.manifest.asset.bytes // 2
        runner.reset()
        assert (runner.step(1) == before).all()  # reading the files changes nothing the model sees
