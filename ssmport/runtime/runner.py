"""The runner on `coreai.runtime`.

- Loads the bundle's asset through the lowering cache (ssmport.runtime.lowering), so later
  loads take milliseconds instead of seconds.
- Binds states by name, allocated zero-filled from the function descriptor with the dtype
  the graph declares, and checks them against the manifest.
- Keeps the exact list of tokens fed since the last reset.
- Feeds prompts through the bundle's `prefill` function, T tokens per call, when it has
  one (see ssmport/prefill.py), and decodes through `main`.
"""

from __future__ import annotations

import atexit
import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ssmport._quiet import native_stderr_filtered
from ssmport.bundle import Bundle
from ssmport.coreai_loop import CoreAILoop, settle
from ssmport.errors import BundleError, SsmportError
from ssmport.interrupts import interrupts_held
from ssmport.layout import MAIN_CALL
from ssmport.layouts import layout_named
from ssmport.manifest import DYNAMIC_DIM, FunctionEntry, with_positions
from ssmport.runtime.kv_growth import START as KV_START
from ssmport.runtime.kv_growth import positions_for, with_rows
from ssmport.runtime.lowering import ensure_lowered, page_in
from ssmport.runtime.prompt_path import prompts_through_prefill
from ssmport.runtime.snapshot import StateSnapshot
from ssmport.prefill import DEFAULT_CHUNK
from ssmport.sampling import sample_next
from ssmport.state import KV, check_room


# Runners still open at exit are closed (and the runtime settled, see ssmport.coreai_loop)
# before the interpreter starts finalizing.
_LIVE: weakref.WeakSet[Runner] = weakref.WeakSet()


def _check_functions(bundle: Bundle, present: list[str], wanted: list[str | None]) -> None:
    """A manifest naming a function its asset lacks is a damaged bundle (the runtime's KeyError)."""
    for name in wanted:
        if name is not None and name not in present:
            raise BundleError(f"{bundle.path}: the manifest names function {name!r}, which the asset does not have "
                              f"(it has {', '.join(present) or 'none'})")  # fmt: skip


@atexit.register
def _close_live_runners() -> None:
    for runner in list(_LIVE):
        runner.close()


class Runner:
    """Run an exported bundle: prompts through `prefill` (when the bundle has it), then
    one token at a time through the decode function `main`.

    `prefill`: None (the default) uses the bundle's prefill function where chunks pay on this
    runtime (ssmport.runtime.prompt_path: not for large branched experts); True whenever the
    bundle has it; False forces the M=1 path for prompts too (tests and benchmarks compare both).
    `profiler`: a `coreai.runtime.Profiler` both functions are loaded with (see
    ssmport.runtime.op_count).
    """

    def __init__(self, bundle: Bundle | str | Path, function: str = "main", prefill: bool | None = None,
                 profiler=None):  # fmt: skip
        from coreai.runtime import AIModel

        self.bundle = bundle if isinstance(bundle, Bundle) else Bundle.open(bundle)
        m = self.bundle.manifest
        self.vocab_size = m.vocab_size
        self._loop = CoreAILoop()
        _LIVE.add(self)
        lowered, self.lowered_now = ensure_lowered(self.bundle)
        self._lowered = lowered
        prefill_entry = m.prefill if (prompts_through_prefill(m) if prefill is None else prefill) else None
        with native_stderr_filtered(), interrupts_held():
            try:
                self._model = self._loop.run_until_complete(AIModel.load(lowered))
            except Exception:
                if self.lowered_now:
                    raise
                # A cached lowering that passed its stamp check but does not load (bytes
                # damaged in place): lower again, once.
                lowered, self.lowered_now = ensure_lowered(self.bundle, rebuild=True)
                self._lowered = lowered
                self._model = self._loop.run_until_complete(AIModel.load(lowered))
            traced = {} if profiler is None else {"profiler": profiler}
            _check_functions(self.bundle, list(self._model.function_names),
                             [function, prefill_entry and prefill_entry.function, m.verify and m.verify.function,
                              m.draft and m.draft.function])  # fmt: skip
            self._fn = self._model.load_function(function, **traced)
            self._prefill = self._model.load_function(prefill_entry.function, **traced) if prefill_entry else None
            self._verify = self._model.load_function(m.verify.function, **traced) if m.verify else None
            self._draft = self._model.load_function(m.draft.function, **traced) if m.draft else None
        self.prefill_chunk: int | None = prefill_entry.chunk if prefill_entry else None
        self.layout = layout_named(m.layout)  # the calling convention (ssmport.layout), see feed()
        # the most tokens one `main` call takes: apple's "decode" main and the ssmport layout, 1
        main_rows = m.main.inputs[0].shape[1]
        self.main_rows = (self.prefill_chunk or DEFAULT_CHUNK) if main_rows == DYNAMIC_DIM else main_rows
        # The positions the bundle's kv states hold (None: no kv state, any length).
        self.context: int | None = m.context
        self._check_descriptor(self._fn, m.main)
        if prefill_entry:
            self._check_descriptor(self._prefill, prefill_entry)
        if m.verify:
            self._check_descriptor(self._verify, m.verify)
        if m.draft:
            self._check_descriptor(self._draft, m.draft, m.draft.states)
        # The most tokens one `verify` call checks (ssmport.verify): the verify function's K, or
        # an apple-layout chunk main's rows; None: this bundle cannot verify drafts.
        self.verify_rows: int | None = m.verify.chunk if m.verify else (self.main_rows if self.main_rows > 1 else None)
        self.tokens: list[int] = []
        # A bundle with a draft head (manifest "draft"): the target's final-norm hidden state of
        # every position fed, row p written by each call that feeds position p (a rewind keeps
        # the rows: those of accepted drafts are what the head catches up from).
        self.hiddens: np.ndarray | None = None
        self._states: dict[str, np.ndarray] = {}
        self.kv_start = KV_START  # a growing KV cache's first allocation (tests set it smaller)
        self.reset()

    @property
    def has_prefill(self) -> bool:
        """Whether prompts go through the bundle's chunked `prefill` function."""
        return self._prefill is not None

    def _check_descriptor(self, fn, entry: FunctionEntry, states=None) -> None:
        """The function's interface as the runtime reports it must be the manifest's (`states`:
        its own, a draft head's; default the bundle's)."""
        d = fn.desc
        expect = {
            "inputs": [t.key for t in entry.inputs],
            "outputs": [t.key for t in entry.outputs],
            "states": [t.key for t in (self.bundle.manifest.states if states is None else states)],
        }
        got = {
            "inputs": [(n, tuple(d.input_descriptor(n).shape), d.input_descriptor(n).dtype) for n in d.input_names],
            "outputs": [(n, tuple(d.output_descriptor(n).shape), d.output_descriptor(n).dtype) for n in d.output_names],
            "states": [(n, tuple(d.state_descriptor(n).shape), d.state_descriptor(n).dtype) for n in d.state_names],
        }
        for kind in expect:
            if expect[kind] != got[kind]:
                raise BundleError(
                    f"{self.bundle.path}: the asset's @{entry.function} {kind} "
                    f"{got[kind]} do not match the manifest {expect[kind]}"
                )

    @property
    def state_names(self) -> list[str]:
        return list(self._fn.desc.state_names)

    def reset(self) -> None:
        """Zero every state (the Linux runtime does not zero buffers for us). A KV cache whose
        positions are dynamic starts small and grows as the tokens need (`_make_room`,
        ssmport.runtime.kv_growth): the runtime clamps a write past the buffer silently, and
        `check_room` keeps within the context."""
        from coreai.runtime import NDArray

        m = self.bundle.manifest
        self._states = {s.name: np.zeros(self._allocated_shape(s, 0), dtype=np.dtype(s.dtype)) for s in m.states}
        # NDArray copies the array: the runtime updates its own buffers (read them via state()).
        self._bound = {name: NDArray(arr) for name, arr in self._states.items()}
        self.tokens = []
        if m.draft is not None:
            self.hiddens = np.zeros((0, m.draft.inputs[2].shape[-1]), dtype=np.float32)
            self._draft_bound = {s.name: NDArray(np.zeros(s.full_shape, dtype=np.dtype(s.dtype))) for s in m.draft.states}

    def _allocated_shape(self, s, tokens: int) -> tuple[int, ...]:
        """The buffer shape of state `s` for `tokens` tokens: a growing KV cache's positions, or a
        growing ring's slots, follow them (kv_growth.positions_for, up to the context or the
        window), any other state its full shape."""
        if not s.dynamic:
            return s.full_shape
        return with_positions(s.shape, positions_for(tokens, s.max_context, self.kv_start))

    @property
    def kv_positions(self) -> int | None:
        """The positions the growing KV caches hold now (None: no growing KV cache)."""
        grown = [self._bound[s.name].shape[3] for s in self.bundle.manifest.kv_states if s.dynamic]
        return min(grown, default=None)

    @property
    def ring_slots(self) -> int | None:
        """The slots the growing rings hold now (None: no growing ring)."""
        grown = [self._bound[s.name].shape[3] for s in self.bundle.manifest.ring_states if s.dynamic]
        return min(grown, default=None)

    def _make_room(self, needed: int) -> None:
        """Grow the growing KV caches and rings to hold `needed` tokens (their rows so far kept:
        a ring smaller than its window has not wrapped, so its slots keep their places)."""
        from coreai.runtime import NDArray

        for s in self.bundle.manifest.states:
            shape = self._allocated_shape(s, needed)
            if s.dynamic and self._bound[s.name].shape[3] < shape[3]:
                self._bound[s.name] = NDArray(with_rows(self._bound[s.name].numpy(), shape[3]))

    def state(self, name: str) -> np.ndarray:
        """The current value of a state (a copy)."""
        self._check_open()
        return self._bound[name].numpy().copy()

    def snapshot(self) -> StateSnapshot:
        """A copy of every state and of the tokens fed: O(fixed state size) plus, for kv
        states, the rows of the tokens so far. A growing ring is kept whole, W slots (those
        not allocated yet are zero), as a static one is."""
        m, n = self.bundle.manifest, len(self.tokens)
        states = {s.name: self._bound[s.name].numpy()[:, :, :, :n].copy() if s.kind == KV
                  else with_rows(self.state(s.name), s.window) if s.dynamic else self.state(s.name)
                  for s in m.states}  # fmt: skip
        return StateSnapshot(m.bundle_id, m.architecture, states, tuple(self.tokens))

    def restore(self, snap: StateSnapshot) -> None:
        """Put the states and token list back as they were when `snap` was taken (a kv state's
        positions past the snapshot are zero: they are never read before being written)."""
        from coreai.runtime import NDArray

        m = self.bundle.manifest
        snap.check_fits(m)
        arrays = {}
        for s in m.states:
            arrays[s.name] = np.ascontiguousarray(snap.states[s.name])
            # a kv state's rows (static: into its whole context), or a growing ring's W slots,
            # into the positions or slots the tokens need
            if s.kind == KV or s.dynamic:
                arrays[s.name] = with_rows(arrays[s.name], self._allocated_shape(s, len(snap.tokens))[3])
        # NDArray copies the array it is given (and `.numpy()` returns a copy): bind new ones.
        self._bound = {name: NDArray(arrays[name]) for name in self.state_names}
        self.tokens = list(snap.tokens)

    def mark(self) -> tuple[dict[str, np.ndarray], int]:
        """What `rewind` returns to: a copy of the fixed states and the token count. O(fixed
        state): a kv state is not copied, its rows past the mark are written again before
        they are read (ssmport.verify)."""
        self._check_open()
        fixed = {s.name: self.state(s.name) for s in self.bundle.manifest.states if s.kind != KV}
        return fixed, len(self.tokens)

    def rewind(self, mark: tuple[dict[str, np.ndarray], int]) -> None:
        """Back to a `mark` taken on this runner since its last reset or restore."""
        from coreai.runtime import NDArray

        fixed, count = mark
        for name, value in fixed.items():
            self._bound[name] = NDArray(value)  # NDArray copies: the mark stays reusable
        del self.tokens[count:]

    def _check_room(self, n: int) -> None:
        check_room(len(self.tokens), n, self.context)

    def _check_open(self) -> None:
        if not hasattr(self, "_fn"):
            raise SsmportError("this Runner is closed (close() or the end of its with block); open the bundle again")

    def _check_ids(self, tokens: list[int]) -> None:
        self._check_open()
        bad = [t for t in tokens if not 0 <= int(t) < self.vocab_size]
        if bad:
            raise SsmportError(f"token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")

    def step(self, token: int) -> np.ndarray:
        """Feed one token through `main`; return the logits after it as float32 [V]."""
        self._check_ids([token])
        self._check_room(1)
        return self._main_call([int(token)])[-1]

    def _main_call(self, chunk: list[int]) -> np.ndarray:
        """`main` over `chunk` (one token in the ssmport layout; up to prefill_chunk in the apple
        layout, whose `position_ids` is the whole history); the logits of its rows [n, V]."""
        from coreai.runtime import NDArray

        first, n = len(self.tokens), len(chunk)
        self._make_room(first + n)
        positions = self.layout.main_positions(first, n)
        inputs = {
            "input_ids": NDArray(np.array([chunk], dtype=np.int32)),
            "position_ids": NDArray(positions.astype(np.int32).reshape(1, -1)),
        }
        with interrupts_held():  # a call is never abandoned half-way (see ssmport.coreai_loop)
            out = self._loop.run_until_complete(self._fn(inputs=inputs, state=self._bound))
            self._record_hidden(out, first, n)
            self.tokens.extend(chunk)
        return np.asarray(out["logits"].numpy(), dtype=np.float32).reshape(n, -1).copy()

    def _record_hidden(self, out: dict, first: int, n: int) -> None:
        """Keep rows 0..n-1 of a call's "hidden" output as positions first..first+n-1."""
        if self.hiddens is None or "hidden" not in out:
            return
        rows = np.asarray(out["hidden"].numpy(), dtype=np.float32).reshape(-1, self.hiddens.shape[1])[:n]
        if len(self.hiddens) < first + n:
            grown = np.zeros((max(first + n, 2 * len(self.hiddens)), self.hiddens.shape[1]), dtype=np.float32)
            grown[: len(self.hiddens)] = self.hiddens
            self.hiddens = grown
        self.hiddens[first : first + n] = rows

    def call(self, function: str, inputs: dict[str, np.ndarray], states: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One raw call of a function on caller-owned arrays: `states` are updated in place, as an
        engine that owns its state buffers drives a bundle (tests/apple_protocol.py drives bundles
        this way). The runner's own states and token list are not touched."""
        from coreai.runtime import NDArray

        self._check_open()
        fn = {self.bundle.manifest.main.function: self._fn}.get(function)
        if fn is None and self._prefill is not None and function == self.bundle.manifest.prefill.function:
            fn = self._prefill
        if fn is None:
            raise SsmportError(f"{self.bundle.path}: no function {function!r} loaded")
        bound = {name: NDArray(np.ascontiguousarray(states[name])) for name in self.state_names}
        with interrupts_held():
            out = self._loop.run_until_complete(fn(inputs={k: NDArray(v) for k, v in inputs.items()}, state=bound))
        for name in self.state_names:
            states[name][...] = bound[name].numpy()
        return {name: value.numpy() for name, value in out.items()}

    def step_each(self, tokens: list[int]) -> np.ndarray:
        """Feed tokens one by one through `main`; return the logits after each, float32 [T, V]."""
        rows = [self.step(t) for t in tokens]
        return np.stack(rows) if rows else np.zeros((0, self.vocab_size), np.float32)

    def feed(self, tokens: list[int]) -> np.ndarray:
        """Feed a prompt; return the logits after its last token, float32 [V].

        The calls are the layout's (Layout.prompt_calls). ssmport layout: through `prefill`,
        `prefill_chunk` tokens per call (the last chunk padded), when the bundle has it and it
        was not turned off; otherwise one token at a time. apple layout: as Apple's engines do,
        all but the last token through `prefill` (which has no outputs) and the last through
        `main`; without prefill, `main` in calls of up to main_rows tokens: one for the "decode"
        main, DEFAULT_CHUNK (64) for the "chunk" main, which every apple-layout architecture
        accepts (the smallest bound on T is RWKV-7's 128).
        """
        if not tokens:
            raise SsmportError("feed needs at least one token")
        self._check_ids(tokens)
        self._check_room(len(tokens))
        tokens = [int(t) for t in tokens]
        chunk = self.prefill_chunk if self.has_prefill else None
        for function, part in self.layout.prompt_calls(tokens, chunk, self.main_rows):
            logits = self._main_call(part)[-1] if function == MAIN_CALL else self._prefill_call(part)
        return logits

    def verify(self, tokens: list[int]) -> np.ndarray:
        """Feed up to `verify_rows` tokens in one call; return the logits after each, float32
        [n, V] (speculative decoding: ssmport.runtime.speculative)."""
        if self.verify_rows is None:
            raise SsmportError(f"{self.bundle.path}: this bundle has no verify function; re-export it with --verify K")
        if not 1 <= len(tokens) <= self.verify_rows:
            raise SsmportError(f"verify takes 1 to {self.verify_rows} tokens (got {len(tokens)})")
        self._check_ids(tokens)
        self._check_room(len(tokens))
        tokens = [int(t) for t in tokens]
        if self._verify is None:  # an apple-layout chunk main
            return self._main_call(tokens)
        out = self._rows_call(self._verify, tokens, self.verify_rows)
        return np.asarray(out["logits"].numpy(), dtype=np.float32).reshape(-1, self.vocab_size)[: len(tokens)].copy()

    @property
    def draft_rows(self) -> int | None:
        """The most rows one call of the bundle's draft head takes (None: it has none)."""
        return self.bundle.manifest.draft.chunk if self.bundle.manifest.draft else None

    def draft(self, tokens: list[int], hiddens: np.ndarray, first: int) -> tuple[np.ndarray, np.ndarray]:
        """One call of the draft head (ssmport.models.qwen3_5.mtp) on its own states: row r is
        token tokens[r] with the hidden state hiddens[r] at position first + r. Returns the
        logits [n, V] and the head's hidden states [n, C] of the n rows. The target's states
        and token list are not touched."""
        from coreai.runtime import NDArray

        self._check_open()
        R, n = self.draft_rows, len(tokens)
        if R is None:
            raise SsmportError(f"{self.bundle.path}: this bundle has no draft head")
        if not 1 <= n <= R or first < 0 or (self.context is not None and first + n > self.context):
            raise SsmportError(f"draft takes 1 to {R} rows within the context (got {n} at position {first})")
        self._check_ids(tokens)
        C = self.hiddens.shape[1]
        inputs = self.layout.rows_inputs([int(t) for t in tokens], first, R)
        rows = np.zeros((1, R, C), dtype=np.float32)
        rows[0, :n] = hiddens
        inputs = {"input_ids": inputs["input_ids"], "position_ids": inputs["position_ids"], "hidden": rows,
                  "valid_len": inputs["valid_len"]}  # fmt: skip
        with interrupts_held():
            out = self._loop.run_until_complete(self._draft(inputs={k: NDArray(v) for k, v in inputs.items()},
                                                            state=self._draft_bound))  # fmt: skip
        logits = np.asarray(out["logits"].numpy(), dtype=np.float32).reshape(R, -1)[:n].copy()
        return logits, np.asarray(out["hidden"].numpy(), dtype=np.float32).reshape(R, C)[:n].copy()

    def _prefill_call(self, chunk: list[int]) -> np.ndarray | None:
        out = self._rows_call(self._prefill, chunk, self.prefill_chunk)
        if "logits" not in out:
            return None
        return np.asarray(out["logits"].numpy(), dtype=np.float32).reshape(-1).copy()

    def _rows_call(self, fn, chunk: list[int], T: int) -> dict:
        """One call of a function over rows (prefill's signature), its inputs the layout's
        (ssmport layout: `chunk` padded to T rows; apple: no padding, the whole history as
        positions)."""
        from coreai.runtime import NDArray

        n, first = len(chunk), len(self.tokens)
        self._make_room(first + n)
        inputs = {name: NDArray(value) for name, value in self.layout.rows_inputs(chunk, first, T).items()}
        with interrupts_held():  # a call is never abandoned half-way (see ssmport.coreai_loop)
            out = self._loop.run_until_complete(fn(inputs=inputs, state=self._bound))
            self._record_hidden(out, first, n)
            self.tokens.extend(chunk)
        return out

    def generate(
        self,
        prompt: list[int],
        max_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        stop: set[int] | None = None,
    ) -> Iterator[int]:
        """Feed the prompt, then yield up to `max_tokens` new ids (greedy at temperature 0)."""
        if not prompt:
            raise SsmportError("generation needs at least one prompt token")
        rng = np.random.default_rng(seed)
        logits = self.feed(prompt)
        for _ in range(max_tokens):
            token = sample_next(logits, temperature, top_p, rng)
            yield token
            if stop and token in stop:
                return
            logits = self.step(token)

    def page_in(self) -> int:
        """Read the loaded model's files into the page cache (`lowering.page_in`), so timed
        calls measure decoding, not a first read of an embedding row from disk: the torch
        peers hold their weights in memory. Returns the bytes read."""
        return page_in(self._lowered)

    def close(self) -> None:
        """Release the runtime objects now, in a fixed order, not at interpreter exit."""
        for attr in ("_bound", "_draft_bound", "_draft", "_prefill", "_verify", "_fn", "_model"):
            if hasattr(self, attr):
                delattr(self, attr)
        gc.collect()
        settle()  # the runtime's threads let go of their Python objects before we go on
        if not self._loop.is_closed():
            self._loop.close()
        _LIVE.discard(self)

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
