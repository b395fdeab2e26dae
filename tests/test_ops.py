"""Every op of ssmport.ops against its plain fp32 naive twin (float64 where only the algebra is
compared), on non-square shapes so a transposed operand cannot pass by accident."""

from __future__ import annotations

import math

import pytest
import torch

from ssmport.ops import attention, conv, deferred, delta_rule, norms, rglru, rows, scan, segsum, ssd, triangular, wkv7

G = torch.Generator().manual_seed(0)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=G, dtype=dtype)


def close(a, b, tol=1e-5):
    assert a.shape == b.shape, (a.shape, b.shape)
    assert float((a - b).abs().max()) <= tol * max(1.0, float(b.abs().max())), float((a - b).abs().max())


# --- rows ---------------------------------------------------------------------------------


def test_row_moves_equal_indexing():
    buf = randn(5, 1, 3, 4)
    for i in range(5):
        assert torch.equal(rows.read_layer(buf, i), rows.read_layer_naive(buf, i))
        assert torch.equal(rows.read_layer(buf, i, flat=True), rows.read_layer_naive(buf, i))
        assert torch.equal(rows.read_layer_by_matmul(buf, i), rows.read_layer_naive(buf, i))
    pieces = [randn(3, 4) for _ in range(5)]
    assert torch.equal(rows.stack_rows(pieces), rows.stack_rows_naive(pieces))
    mixed = [randn(3, 4), randn(12), randn(2, 1, 6)]  # one size, other shapes: each piece flattened
    assert torch.equal(rows.stack_rows(mixed), rows.stack_rows_naive(mixed))
    out = torch.zeros(5, 3, 4)
    rows.write_once(out, pieces)
    assert torch.equal(out, torch.stack(pieces))
    a, b = randn(3, 6), randn(4, 6)
    picks = torch.tensor([6, 0, 3, 2, 2])
    assert torch.equal(rows.select_rows([a, b], picks), rows.select_rows_naive([a, b], picks))


@pytest.mark.parametrize("T", [1, 2, 7])
def test_token_shift_and_last_valid(T):
    x, prev = randn(T, 6), randn(1, 6)
    assert torch.equal(rows.token_shift(x, prev), rows.token_shift_naive(x, prev))
    for n in range(1, T + 1):
        assert torch.equal(rows.last_valid(x, torch.tensor([n])), rows.last_valid_naive(x, torch.tensor([n])))


# --- norms --------------------------------------------------------------------------------


def test_norms_equal_torch():
    x = randn(3, 2, 24)
    w, b = randn(24), randn(24)
    close(norms.rms_norm(x, w, 1e-5), norms.rms_norm_naive(x, w, 1e-5))
    close(norms.grouped_rms_norm(x, w, 4, 1e-5), norms.grouped_rms_norm_naive(x, w, 4, 1e-5))
    close(norms.group_norm(x.view(3, 4, 12), w.repeat(2), b.repeat(2), 1e-5),
          norms.group_norm_naive(x.view(3, 4, 12), w.repeat(2), b.repeat(2), 1e-5))  # fmt: skip
    close(norms.l2_normalize(x, 1e-6), norms.l2_normalize_naive(x, 1e-6))
    close(norms.unit_normalize(x), norms.unit_normalize_naive(x))


# --- conv, scan, segsum, deferred ---------------------------------------------------------


@pytest.mark.parametrize("P,T,W,valid", [(3, 1, 4, None), (3, 8, 4, 5), (4, 6, 4, 6), (2, 5, 3, 1)])
def test_causal_conv_equals_the_window_sum(P, T, W, valid):
    past, new, weight = randn(P, 7), randn(T, 7), randn(W, 7)
    vl = None if valid is None else torch.tensor([valid])
    got, got_past = conv.causal_conv(past, new, weight, vl)
    want, want_past = conv.causal_conv_naive(past, new, weight, valid)
    close(got, want)
    if isinstance(got_past, conv.ShiftIn):  # a decode step: its past written by shift_in
        stacked = past.clone()[None]
        conv.shift_in(stacked, [got_past.row])
        got_past = stacked[0]
    assert torch.equal(got_past, want_past)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_shift_in_writes_every_layers_past_shifted(dtype):
    """Each layer's past [P, D] loses its oldest row and takes its new one, bit for bit."""
    buffer, rows = randn(3, 1, 4, 7).to(dtype), [randn(1, 7) for _ in range(3)]
    want = buffer.clone()
    conv.shift_in(buffer, rows)
    conv.shift_in_naive(want, rows)
    assert torch.equal(buffer, want)


@pytest.mark.parametrize("valid", [1, 4, 6])
def test_scan_runs_valid_len_steps(valid):
    def step(s, x):
        return s * 0.9 + x, s.sum(-1, keepdim=True)

    state, xs = randn(1, 1, 5), randn(6, 1, 5)
    got = scan.scan(step, state, (xs,), torch.tensor([valid]), (1, 1), keep_row_dim=True)
    want = scan.scan_naive(step, state, (xs,), valid, (1, 1), keep_row_dim=True)
    close(got[0], want[0])
    close(got[1], want[1])


@pytest.mark.parametrize("valid", [1, 5, 7])
def test_chunk_decays_equal_the_explicit_sums(valid):
    log_decay = -torch.rand(7, 3, generator=G, dtype=torch.float64)
    got, want = segsum.chunk_decays(log_decay, torch.tensor([valid])), segsum.chunk_decays_naive(log_decay, valid)
    for a, b in zip(got, want):
        close(a, b, 1e-12)


@pytest.mark.parametrize("T, max_tokens", [(1, None), (5, None), (16, None), (40, None), (64, None), (128, None), (6, 64)])
def test_unit_lower_inverse_equals_forward_substitution(T, max_tokens):
    """The WY forms' (I + N)^-1 as a product of matmuls; with `max_tokens` (a symbolic T) it
    takes more factors than T needs, and the extra ones are exactly I."""
    n = torch.randn(2, T, T, generator=G, dtype=torch.float64).tril(-1) * 0.3
    got = triangular.unit_lower_inverse(-n, max_tokens)
    close(got, triangular.unit_lower_inverse_naive(-n), 1e-10)
    close(got @ (torch.eye(T, dtype=torch.float64) + n), torch.eye(T, dtype=torch.float64).expand(2, T, T), 1e-10)


def test_unit_lower_inverse_stays_exact_in_fp32_where_one_level_does_not():
    """Correlated unit keys with slow decay, the shape of RWKV-7's removal terms at T = 64
    (|N| 0.43, the inverse's largest entry 1): the one-level product's powers grow and cancel
    in fp32; the two-level solve stays at fp32 rounding."""
    T, d = 64, 64
    g = torch.Generator().manual_seed(0)
    keys = torch.nn.functional.normalize(torch.randn(d, generator=g) + torch.randn(T, d, generator=g), dim=-1)
    t = torch.arange(T, dtype=torch.float32)
    n = (0.6 * (keys @ keys.T) * torch.exp(-0.01 * (t.view(-1, 1) - t.view(1, -1)))).tril(-1)
    want = triangular.unit_lower_inverse_naive(-n.double())
    assert float((triangular.unit_lower_inverse(-n).double() - want).abs().max()) < 1e-5
    assert float((triangular._power_product(-n, T).double() - want).abs().max()) > 1e-2  # why there are two levels


def test_wkv7_chunk_stays_at_fp32_rounding_with_correlated_removal_keys():
    """64 tokens whose removal keys share a direction, slow decay, a near 1: the case where a
    one-level (I + A)^-1 drifted (6e-3 in rwkv7-0.1b's deeper layers); the fp64 loop is the
    reference."""
    T, H, N, Nv = 64, 2, 64, 16
    g = torch.Generator().manual_seed(1)
    kk = norms.unit_normalize(torch.randn(1, H, N, generator=g) + torch.randn(T, H, N, generator=g))
    S0, r, k, v = (torch.randn(*s, generator=g) for s in ((H, N, Nv), (T, H, N), (T, H, N), (T, H, Nv)))
    w, kka = torch.full((T, H, N), 0.995), kk * 0.9
    S_chunk, _ = wkv7.chunk(S0, r, w, kk, kka, k, v, torch.tensor([T]))
    S = S0.double()
    for t in range(T):
        S, _ = wkv7.step(S.view(1, H, N, Nv), *(x[t].double().view(shape) for x, shape in (
            (r, (1, H, 1, N)), (w, (1, H, N, 1)), (kk, (1, H, 1, N)), (kka, (1, H, N, 1)), (k, (1, H, N, 1)),
            (v, (1, H, 1, Nv)))))  # fmt: skip
    close(S_chunk.double(), S.view(H, N, Nv), 1e-4)


def test_deferred_update_equals_per_layer_updates():
    L, view = 3, (2, 4, 5)
    shapes = ((2, 4, 1), (2, 4, 1), (2, 1, 5), (2, 4, 1), (2, 1, 5))
    updates = [deferred.StateUpdate(torch.rand(2, 4, generator=G),
                                    (deferred.Outer(randn(2, 4), randn(2, 5), minus=True),
                                     deferred.Outer(randn(8), randn(2, 5))), view, shapes) for _ in range(L)]  # fmt: skip
    state = randn(L, 1, *view)
    want = torch.stack([deferred.apply_naive(state[i, 0], u) for i, u in enumerate(updates)]).view(state.shape)
    deferred.apply(state, updates)
    close(state, want)


def test_deferred_update_of_a_state_stored_in_another_shape():
    """A state whose layer slice is not [1, .., *view] ([L, 40] for a [2, 4, 5] view): the
    update views it as [L, *view] and writes it back in its own shape."""
    L, view = 3, (2, 4, 5)
    shapes = ((2, 4, 1), (2, 4, 1), (2, 1, 5))
    updates = [deferred.StateUpdate(torch.rand(2, 4, generator=G), (deferred.Outer(randn(2, 4), randn(2, 5)),), view, shapes)
               for _ in range(L)]  # fmt: skip
    state = randn(L, 40)
    want = torch.stack([deferred.apply_naive(state[i], u).reshape(40) for i, u in enumerate(updates)])
    deferred.apply(state, updates)
    close(state, want)


@pytest.mark.parametrize("axis, times", [(0, 3), (1, 2), (2, 1)])
def test_repeat_groups_equals_repeat_interleave(axis, times):
    x = randn(2, 3, 4)
    torch.testing.assert_close(rows.repeat_groups(x, axis, times), rows.repeat_groups_naive(x, axis, times), rtol=0, atol=0)


def test_deferred_exp_decay_equals_each_layer_by_hand():
    """A decay given as exp(rate * scale) (Mamba-1's dt and A): the stacked update, and the
    naive twin, against S * exp(rate * scale) + col row^T written out per layer."""
    L, I, N = 3, 6, 5
    scales = [-4 * torch.rand(I, N, generator=G) for _ in range(L)]
    rates, cols, rows_ = [torch.rand(I, generator=G) for _ in range(L)], [randn(I) for _ in range(L)], [randn(N) for _ in range(L)]
    updates = [deferred.StateUpdate(deferred.Exp(rates[i], scales[i]), (deferred.Outer(cols[i], rows_[i]),), (I, N),
                                    ((I, 1), (I, 1), (1, N))) for i in range(L)]  # fmt: skip
    state = randn(L, I * N)
    want = torch.stack([state[i].view(I, N) * torch.exp(rates[i][:, None] * scales[i]) + cols[i][:, None] * rows_[i][None, :]
                        for i in range(L)])  # fmt: skip
    for i, u in enumerate(updates):
        close(deferred.apply_naive(state[i], u), want[i])
    deferred.apply(state, updates)
    close(state.view(L, I, N), want)


# --- recurrences ----------------------------------------------------------------------------


def test_wkv7_decode_and_step_equal_the_naive_head_loop():
    H, N, Nv = 3, 4, 6  # Nv != N: a transposed state fails
    S = randn(H, N, Nv)
    r, kk_raw, k = randn(H, N), randn(H, N), randn(H, N)
    w, a, v = torch.rand(H, N, generator=G) * 0.5 + 0.5, torch.rand(H, N, generator=G), randn(H, Nv)
    kk = norms.unit_normalize(kk_raw)
    heads = lambda t: t.view(H, 1, -1)  # noqa: E731  decode's operand shape
    y, update = wkv7.decode(S, *(heads(t) for t in (r, w, kk, kk * a, k, v)))
    S_new = deferred.apply_naive(S, update)
    S_step, y_step = wkv7.step(S.view(1, H, N, Nv), r.view(1, H, 1, N), w.view(1, H, N, 1), kk.view(1, H, 1, N),
                               (kk * a).view(1, H, N, 1), k.view(1, H, N, 1), v.view(1, H, 1, Nv))  # fmt: skip
    for h in range(H):  # the naive step runs in BlinkDL's [V, K] layout
        s_ref, y_ref = wkv7.naive_step(S[h].t(), r[h], w[h], kk[h], a[h], k[h], v[h])
        close(S_new[h], s_ref.t())
        close(S_step[0, h], s_ref.t())
        close(y[h, 0], y_ref)
        close(y_step[0, h, 0], y_ref)


def test_ssd_decode_equals_the_naive_head_loop():
    H, P, N, G_ = 4, 3, 5, 2
    S, dtx, BC = randn(H, P, N), randn(H, P), randn(2, G_, N)
    dt, A, x = torch.rand(H, generator=G), -torch.rand(H, generator=G) * 3, randn(H, P)
    y, update = ssd.decode(S, torch.exp(dt * A), dt.view(H, 1) * x, BC)
    S_new = deferred.apply_naive(S.view(update.view), update).view(H, P, N)
    for h in range(H):
        g = h // (H // G_)
        s_ref, y_ref = ssd.naive_step(S[h], x[h], dt[h], A[h], BC[0, g], BC[1, g])
        close(S_new[h], s_ref)
        close(y[h], y_ref)


@pytest.mark.parametrize("G_", [1, 2, 4])
def test_ssd_updates_applied_as_one_stack_equal_the_naive_head_loop(G_):
    """B shared by groups of heads (G of H = 4), every layer's update applied to the whole
    [L, 1, H, P, N] stack at once (B's stack repeated per head, ops.deferred.PerGroup)."""
    L, H, P, N = 3, 4, 3, 4  # N == H: the head axis is found by position, not by size
    state = randn(L, 1, H, P, N)
    inputs = [(torch.rand(H, generator=G), -torch.rand(H, generator=G) * 3, randn(H, P), randn(2, G_, N)) for _ in range(L)]
    updates = [ssd.decode(state[i, 0], torch.exp(dt * A), dt.view(H, 1) * x, BC)[1] for i, (dt, A, x, BC) in enumerate(inputs)]
    want = state.clone()
    for i, (dt, A, x, BC) in enumerate(inputs):
        for h in range(H):
            want[i, 0, h] = ssd.naive_step(state[i, 0, h], x[h], dt[h], A[h], BC[0, h // (H // G_)], BC[1, h // (H // G_)])[0]
    deferred.apply(state, updates)
    close(state, want)


@pytest.mark.parametrize("valid", [1, 5, 9])
def test_ssd_chunk_equals_the_step_loop(valid):
    H, P, N, G_, T = 4, 3, 5, 2, 9
    dt = torch.rand(T, H, generator=G, dtype=torch.float64)
    A = -torch.rand(H, generator=G, dtype=torch.float64) * 2
    x, BC, S0 = randn(T, H, P, dtype=torch.float64), randn(T, 2, G_, N, dtype=torch.float64), randn(H, P, N, dtype=torch.float64)
    S_chunk, y_chunk = ssd.chunk(S0, dt * A, dt.view(T, H, 1) * x, BC, torch.tensor([valid]))
    S = S0.clone()
    for t in range(valid):
        for h in range(H):
            g = h // (H // G_)
            S[h], y = ssd.naive_step(S[h], x[t, h], dt[t, h], A[h], BC[t, 0, g], BC[t, 1, g])
            close(y_chunk[t, h], y, 1e-9)
    close(S_chunk, S, 1e-9)


def test_delta_rule_decode_and_step_equal_the_naive_head_loop():
    HV, dk, dv = 3, 4, 6
    S, v = randn(HV, dk, dv), randn(HV, dv)
    q, k = norms.l2_normalize(randn(HV, dk), 1e-6), norms.l2_normalize(randn(HV, dk), 1e-6)
    beta, g = torch.rand(HV, 1, 1, generator=G), torch.rand(HV, 1, 1, generator=G)
    o, update = delta_rule.decode(S, q, k, v, beta, g)
    S_step, o_step = delta_rule.step(S, q, k, v, beta, g)
    for h in range(HV):
        s_ref, o_ref = delta_rule.naive_step(S[h], q[h], k[h], v[h], beta[h, 0, 0], g[h, 0, 0])
        close(deferred.apply_naive(S, update)[h], s_ref)
        close(S_step[h], s_ref)
        close(o[h], o_ref)
        close(o_step[h], o_ref)


@pytest.mark.parametrize("valid", [1, 6, 8])
def test_delta_rule_chunk_equals_the_naive_loop(valid):
    T, HV, dk, dv = 8, 3, 4, 6
    f64 = torch.float64
    q = norms.l2_normalize(randn(T, HV, dk, dtype=f64), 1e-6)
    k = norms.l2_normalize(randn(T, HV, dk, dtype=f64), 1e-6)
    v, S0 = randn(T, HV, dv, dtype=f64), randn(HV, dk, dv, dtype=f64)
    beta, log_g = 2 * torch.rand(T, HV, generator=G, dtype=f64), -torch.rand(T, HV, generator=G, dtype=f64)
    S_chunk, o_chunk = delta_rule.chunk(S0, q, k, v, beta, log_g, torch.tensor([valid]))
    S = S0.clone()
    for t in range(valid):
        for h in range(HV):
            S[h], o = delta_rule.naive_step(S[h], q[t, h], k[t, h], v[t, h], beta[t, h], math.exp(log_g[t, h]))
            close(o_chunk[t, h], o, 1e-9)
    close(S_chunk, S, 1e-9)


# --- attention ------------------------------------------------------------------------------


def test_attention_decode_over_the_cache_equals_softmax_over_the_past():
    H, KVH, d, C, pos = 6, 2, 5, 16, 9
    q, k, v = randn(H, d), randn(KVH, d), randn(KVH, d)
    K, V = randn(KVH, C, d), randn(KVH, C, d)  # rows >= pos hold stale values: must be ignored
    got = attention.decode(q, k, v, K, V, torch.tensor([pos]), d**-0.5)
    close(got, attention.naive(q, k, v, K[:, :pos].transpose(0, 1), V[:, :pos].transpose(0, 1)))
    got0 = attention.decode(q, k, v, K, V, torch.tensor([0]), d**-0.5)  # no past at all
    close(got0, attention.naive(q, k, v, torch.zeros(0, KVH, d), torch.zeros(0, KVH, d)))


@pytest.mark.parametrize("start", [0, 3])
def test_attention_chunk_equals_token_by_token(start):
    T, H, KVH, d, C = 5, 4, 2, 3, 12
    q, k, v = randn(T, H, d), randn(T, KVH, d), randn(T, KVH, d)
    K, V = randn(KVH, C, d), randn(KVH, C, d)
    got = attention.chunk(q, k, v, K, V, torch.tensor([start]), d**-0.5)
    past_k, past_v = K[:, :start].transpose(0, 1), V[:, :start].transpose(0, 1)
    for t in range(T):
        want = attention.naive(q[t], k[t], v[t], torch.cat([past_k, k[:t]]), torch.cat([past_v, v[:t]]))
        close(got[t], want)


@pytest.mark.parametrize("rotary_dim", [8, 4])
def test_rotary_equals_rotate_half(rotary_dim):
    T, heads, d = 5, 3, 8
    x, positions = randn(T, heads, d), torch.tensor([0, 1, 7, 100, 4095])
    cos, sin = attention.rotary_tables(positions, attention.rotary_frequencies(d, rotary_dim, 10000.0))
    got = attention.apply_rotary(x, cos, sin, attention.rotate_half_matrix(d, rotary_dim))
    close(got, attention.apply_rotary_naive(x, positions, rotary_dim, 10000.0))


@pytest.mark.parametrize("T,valid", [(1, 1), (8, 5), (16, 16), (64, 64), (64, 40), (48, 20)])  # 64, 48: sub-chunks
def test_wkv7_chunk_equals_the_step_loop(T, valid):
    H, N, Nv = 2, 8, 6
    f64 = torch.float64
    S0, r, k, v = randn(H, N, Nv, dtype=f64), randn(T, H, N, dtype=f64), randn(T, H, N, dtype=f64), randn(T, H, Nv, dtype=f64)
    kk = norms.unit_normalize(randn(T, H, N, dtype=f64))
    a = torch.rand(T, H, N, generator=G, dtype=f64)
    w = torch.exp(-math.exp(-0.5) * torch.sigmoid(4 * randn(T, H, N, dtype=f64)))  # RWKV-7's decay range
    S_chunk, y_chunk = wkv7.chunk(S0, r, w, kk, kk * a, k, v, torch.tensor([valid]))
    S = S0.clone()
    for t in range(valid):
        for h in range(H):  # the naive step in BlinkDL's [V, K] layout
            s, y = wkv7.naive_step(S[h].t(), r[t, h], w[t, h], kk[t, h], a[t, h], k[t, h], v[t, h])
            S[h] = s.t()
            close(y_chunk[t, h], y, 1e-9)
    close(S_chunk, S, 1e-9)


def test_wkv7_chunk_holds_in_fp32_at_the_longest_chunk_and_the_strongest_decay():
    """exp(+-L) stays inside fp32 at MAX_CHUNK tokens of the strongest decay RWKV-7 allows."""
    T, H, N, Nv = wkv7.MAX_CHUNK, 2, 16, 8
    S0, r, k, v = randn(H, N, Nv), randn(T, H, N), randn(T, H, N), randn(T, H, Nv)
    kk = norms.unit_normalize(randn(T, H, N))
    w = torch.full((T, H, N), math.exp(-math.exp(-0.5)) * 1.0001)
    S_chunk, y_chunk = wkv7.chunk(S0, r, w, kk, kk * 0.5, k, v, torch.tensor([T]))
    S = S0.double()
    for t in range(T):
        S, _ = wkv7.step(S.view(1, H, N, Nv), *(x[t].double().view(shape) for x, shape in (
            (r, (1, H, 1, N)), (w, (1, H, N, 1)), (kk, (1, H, 1, N)), (kk * 0.5, (1, H, N, 1)), (k, (1, H, N, 1)),
            (v, (1, H, 1, Nv)))))  # fmt: skip
    assert torch.isfinite(S_chunk).all() and torch.isfinite(y_chunk).all()
    close(S_chunk.double(), S.view(H, N, Nv), 1e-4)


# --- RG-LRU (RecurrentGemma) ------------------------------------------------------------------


def _rglru_inputs(T: int, start: int, strong: bool = False):
    """A 3-head RG-LRU of width 12 (head width 4) over T tokens from position `start`; Λ
    spread so that -8 softplus(Λ) r reaches -40 per token (`strong`: -200)."""
    heads, d = 3, 4
    w_i, w_r, b_i, b_r = randn(heads, d, d), randn(heads, d, d), randn(heads, d), randn(heads, d)
    lam = randn(heads * d) * (25.0 if strong else 4.0)
    x, positions = randn(T, heads * d), torch.arange(start, start + T)
    h0 = torch.zeros(heads * d) if start == 0 else randn(heads * d)
    log_a, u, reset = rglru.gate(x, torch.cat([w_i, w_r], -1), torch.cat([b_i, b_r], -1).unsqueeze(1),
                                 rglru.DECAY_SCALE * torch.nn.functional.softplus(lam), positions)  # fmt: skip
    return (h0, x, w_i, b_i, w_r, b_r, lam, positions), (log_a, u, reset)


@pytest.mark.parametrize("start", [0, 3])
def test_rglru_gate_and_decode_equal_the_naive_step(start):
    (h0, x, w_i, b_i, w_r, b_r, lam, positions), (log_a, u, reset) = _rglru_inputs(9, start)
    h, hd = h0.clone(), h0.clone()
    for t in range(9):
        h, y = rglru.naive_step(h, x[t], w_i, b_i, w_r, b_r, lam, int(positions[t]) == 0)
        hd = rglru.decode(hd, log_a[t : t + 1], u[t : t + 1], reset[t : t + 1]).view(-1)
        close(hd, y)
    assert bool(reset[0]) == (start == 0) and not reset[1:].any()


@pytest.mark.parametrize("T, valid, start, block", [(1, 1, 0, 16), (8, 5, 0, 16), (32, 32, 0, 16), (32, 27, 4, 8),
                                                    (48, 48, 2, 16), (20, 13, 0, 16)])  # fmt: skip
def test_rglru_chunk_equals_the_m1_loop(T, valid, start, block):
    """Several pairwise blocks (T a multiple of the block) and one (20, 1), padding rows last."""
    (h0, *_), (log_a, u, reset) = _rglru_inputs(T, start)
    h, last = rglru.chunk(h0, log_a, u, reset, torch.tensor([valid]), pair_block=block)
    want, want_last = rglru.chunk_naive(h0, log_a, u, reset, valid)
    close(h[:valid], want[:valid])
    close(last, want_last)


def test_rglru_chunk_holds_at_the_strongest_decay():
    """log a down to -200 per token: a prefix product over a 64-token chunk would be exp(-12800)."""
    (h0, *_), (log_a, u, reset) = _rglru_inputs(64, 5, strong=True)
    assert float(log_a.min()) < -100
    h, last = rglru.chunk(h0, log_a, u, reset, torch.tensor([64]))
    want, want_last = rglru.chunk_naive(h0, log_a, u, reset, 64)
    assert torch.isfinite(h).all()
    close(h, want)
    close(last, want_last)
