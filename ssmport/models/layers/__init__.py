"""The layers the families share, one module each, and the names (Apple's) of the stacked
states they read and write:

    attention.py     softmax attention over a KV cache or a ring (AttentionSpec, AttentionNames,
                     attention_names / attention_shapes, AttentionMixer) and the references' step
    delta_rule.py    the gated delta-rule layer of Gated DeltaNet, Qwen3.5 and OLMo-Hybrid
                     (DeltaRuleSpec, DeltaRuleNames, DeltaRuleMixer) and the references' token
    mamba2_mixer.py  the Mamba-2 mixer of Mamba-2, Granite-4.0-H, Nemotron-H and Falcon-H1
                     (MixerSpec, Mamba2Mixer, Mamba2StateMixer over the hybrids' stacked states)
    mlp.py           SwiGLU and the relu^2 MLP
    head.py          the final norm and LM head (norm_head), the scaled embedding

Each layer takes the already-normed input h [T, C] and returns its contribution (the family's
block owns the pre-norm, the residual and any multiplier). Weights come from the builder under
the family's canonical names; projections that read the same input are fused into one matmul
(fewer ops here, and fewer dispatches on a GPU).
"""

KEY_CACHE, VALUE_CACHE = "keyCache", "valueCache"  # Apple's names for the stacked KV states
# The sliding-window layers' rings (kind "ring"): static shapes named "...Cache", which Apple's
# engines' heuristic takes for a sliding cache (docs/apple-engines.md).
SLIDING_KEY_CACHE, SLIDING_VALUE_CACHE = "slidingKeyCache", "slidingValueCache"
# The apple layout keeps both rings as one state (the key rows, then the value rows), so that
# LFM3's states number four, as many as Apple's engines take (docs/apple-engines.md, section 5).
SLIDING_CACHE = "slidingCache"
CONV_STATES, RECURRENT_STATES = "convStates", "recurrentStates"  # and for its stacked fixed states
