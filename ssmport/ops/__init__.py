"""Runtime-shaped torch primitives, each beside a plain fp32 "naive" twin.

Every architecture is written from these. An op here is shaped for what the Linux Core AI
runtime runs fast (row lookups instead of slices, 0/1 selection matmuls instead of concat,
x*x instead of pow, a whole-state deferred update instead of per-layer scatters) without
adding ops a GPU would pay a dispatch for; its naive twin says the same thing in the most
readable torch, and tests/test_ops.py ties each pair together.

    rows        read_layer, stack_rows, write_once, select_rows, repeat_groups, token_shift, last_valid
    norms       rms_norm, grouped_rms_norm, layer_norm, head_norm, l2_normalize
    conv        causal_conv: the depthwise short conv over a carried window of past inputs
    scan        an in-graph while_loop over a step function (valid_len steps)
    segsum      the chunk preamble of chunkwise forms: prefix sums and pairwise decays
    deferred    StateUpdate: S' = S * decay + sum of outer products, applied once per state
    wkv7        RWKV-7's WKV recurrence: naive step, decode read, prefill step
    ssd         Mamba-2's SSM: naive step, decode read, chunkwise (SSD) form
    selective_scan  Mamba-1's per-channel scan: naive step, decode read, blocked pairwise chunk form
    delta_rule  the gated delta rule: naive step, decode read, chunkwise (WY) form
    rglru       RecurrentGemma's RG-LRU: its gates, naive step, decode, pairwise chunk form
    attention   causal attention over a positional KV cache: decode and chunk
    sliding     sliding-window attention over a ring buffer (slot = position mod window, mask
                from the positions): decode, chunk (any length), the ring write
    matmul      FloatMatmul / BlockwiseMatmul (x @ W [in, out]); the only module that touches
                coreai-torch's compression internals
"""
