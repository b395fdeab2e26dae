"""ssmport check-engine BUNDLE: which of Apple's engines can drive the bundle, and the guards the others fail."""

from __future__ import annotations

import json


def add_parser(sub) -> None:
    p = sub.add_parser(
        "check-engine",
        help="which of Apple's engines (CoreAILanguageModels) can drive a bundle, and why not",
        description="Check a bundle against the rules of Apple's CoreAILanguageModels engines "
        "(sequential, pipelined, static-shape) at each source revision read (docs/apple-engines.md): "
        "the bundle loader, the tokenizer files, the functions' signatures, the state kinds. For each "
        "engine that cannot drive it: the exact guard, with its source line. Exit status 1 if no "
        "engine at the newest revision can drive the bundle.",
    )
    p.add_argument("bundle")
    p.add_argument("--json", action="store_true", help="the verdicts as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from ssmport.apple import REVISIONS, check_engines, describe_directory
    from ssmport.apple.description import FunctionDesc, TensorDesc
    from ssmport.bundle import Bundle
    from ssmport.manifest import DYNAMIC_DIM

    bundle = Bundle.open(args.bundle)
    m = bundle.manifest

    def desc(entries) -> tuple[TensorDesc, ...]:
        return tuple(TensorDesc(t.name, tuple(None if d == DYNAMIC_DIM else d for d in t.shape), t.dtype) for t in entries)

    functions = {m.main.function: FunctionDesc(desc(m.main.inputs), desc(m.main.outputs), desc(m.states))}
    if m.prefill is not None:
        functions[m.prefill.function] = FunctionDesc(desc(m.prefill.inputs), desc(m.prefill.outputs), desc(m.states))
    verdicts = check_engines(describe_directory(bundle.path, functions))
    newest = REVISIONS[-1]
    if args.json:
        print(json.dumps([{"engine": v.engine, "revision": v.revision, "can_drive": v.can_drive, "default": v.default,
                           "guards": [str(g) for g in v.failures]} for v in verdicts], indent=2))  # fmt: skip
    else:
        print(f"{m.name}  (layout {m.layout}; states {', '.join(s.name for s in m.states)})")
        for v in verdicts:
            mark = "drives" if v.can_drive else ("loads, misdrives" if v.loads else "cannot drive")
            print(f"  {v.engine:12} @{v.revision:14} {mark}{'  (default engine)' if v.default else ''}")
            for guard in v.failures:
                print(f"      {guard}")
    return 0 if any(v.can_drive for v in verdicts if v.revision == newest) else 1
