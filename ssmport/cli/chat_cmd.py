"""ssmport chat BUNDLE: a multi-turn conversation that reuses the recurrent state."""

from __future__ import annotations

import sys

from ssmport.cli.common import MAX_GENERATE, check_float, check_int, check_sampling, read_text_file
from ssmport.errors import SsmportError

MAX_SNAPSHOTS = 100_000
MAX_SNAPSHOT_MB = 1 << 20  # 1 TB

HELP_LINES = ("commands: /retry (new reply to the last message), /undo (drop the last turn), /reset, /quit; "
              "Ctrl-C stops a reply")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "chat",
        help="interactive multi-turn chat that reuses the state between turns",
        description="Chat with a bundle on the Core AI runtime. The state after every turn is "
        "kept as a snapshot, so a turn feeds only its own new tokens, and /retry or /undo rewind "
        "to a snapshot instead of re-reading the conversation. " + HELP_LINES + ".",
    )
    p.add_argument("bundle")
    p.add_argument("--script", help="read the user's lines from FILE instead of the terminal (one per line)")
    p.add_argument("-n", "--max-tokens", type=int, default=256, help="reply length limit (default 256)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1.0)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--max-snapshots", type=int, default=16, help="snapshots kept (default 16)")
    p.add_argument("--snapshot-mb", type=float, default=256, help="memory for snapshots, MB (default 256)")
    p.add_argument("--state", help="continue from a state saved with --save-state (same bundle only)")
    p.add_argument("--save-state", help="save the conversation's state here at the end (safetensors)")
    p.add_argument("--stats", action="store_true", help="after each reply, print tokens reused / fed to stderr")
    p.add_argument("--draft", metavar="lookup|mtp|BUNDLE", help="speculative decoding, as `generate --draft` "
                   "(needs a bundle exported with --verify K); the replies are the same at temperature 0")
    p.add_argument("--draft-tokens", type=int, metavar="K", help="with --draft: tokens one verify call checks")
    p.set_defaults(func=run)


def _lines(script: list[str] | None):
    if script is None:
        while sys.stdin is not None:  # started with stdin closed: nothing to read
            try:
                line = input("> ")
                # Python reads stdin with surrogateescape in the C locale and in UTF-8 mode: the
                # undecodable bytes arrive as surrogates instead of an error.
                line.encode("utf-8", "surrogateescape").decode("utf-8")
                yield line
            except EOFError:
                return
            except UnicodeDecodeError as exc:
                raise SsmportError(f"standard input: not valid UTF-8 text ({exc.reason} at byte {exc.start} of the line)") from None
        return
    for line in script:
        print(f"> {line}")
        yield line


def run(args) -> int:
    from ssmport.bundle import Bundle
    from ssmport.files import check_output
    from ssmport.gate.run import bundle_tokenizer
    from ssmport.runtime import Runner
    from ssmport.runtime.chat import ChatSession, chat_template
    from ssmport.runtime.snapshot import StateSnapshot
    from ssmport.runtime.snapshot_cache import SnapshotCache
    from ssmport.runtime.speculative import speculative_decoder

    # Everything is checked before the chat starts, not when it ends: the options, the
    # script, the saved state and where the state is to be saved.
    check_int(args.max_tokens, "--max-tokens", 1, MAX_GENERATE)
    check_int(args.max_snapshots, "--max-snapshots", 1, MAX_SNAPSHOTS)
    check_float(args.snapshot_mb, "--snapshot-mb", 0.0, MAX_SNAPSHOT_MB, above=True)
    check_sampling(args)
    if args.draft_tokens is not None and args.draft is None:
        raise SsmportError("--draft-tokens applies with --draft only")
    script = read_text_file(args.script).splitlines() if args.script is not None else None
    bundle = Bundle.open(args.bundle)
    tokenizer = bundle_tokenizer(bundle)
    if tokenizer is None:
        raise SsmportError(f"{bundle.path}: has no tokenizer, so it cannot chat in text")
    snap = None
    if args.state:
        snap = StateSnapshot.load(args.state)
        snap.check_fits(bundle.manifest)
    if args.save_state:
        check_output(args.save_state, "--save-state")
    template = chat_template(bundle, tokenizer)
    sampling = {"temperature": args.temperature, "top_p": args.top_p, "seed": args.seed}
    cache = SnapshotCache(args.max_snapshots, int(args.snapshot_mb * (1 << 20)))
    with Runner(bundle) as runner, speculative_decoder(runner, args.draft, args.draft_tokens) as decoder:
        session = ChatSession(runner, tokenizer, template, cache, decoder)
        if snap is not None:
            runner.restore(snap)
            session.transcript = list(snap.tokens)
        if bundle.manifest.synthetic_weights:
            print("[synthetic weights: replies are noise by design]", file=sys.stderr)
        if template.continues:
            print(f"[{template.continues}]", file=sys.stderr)
        if script is None and sys.stdin is not None and sys.stdin.isatty():
            print(HELP_LINES, file=sys.stderr)
        turns: list[tuple[list[int], str]] = []  # (transcript before the turn, message)
        for line in _lines(script):
            command = line.strip()
            if command in ("/quit", "/exit"):
                break
            if command == "/reset":
                session.reset()
                turns.clear()
                continue
            if command in ("/undo", "/retry"):
                if not turns:
                    print("(nothing to undo)", file=sys.stderr)
                    continue
                before, message = turns.pop()
                session.transcript = before
                if command == "/undo":
                    continue
            elif not command:
                continue
            else:
                message = line
            turns.append((list(session.transcript), message))
            try:
                for piece in session.send(message, args.max_tokens, **sampling):
                    sys.stdout.write(piece)
                    sys.stdout.flush()
            except KeyboardInterrupt:
                if script is not None:
                    raise
                # Ctrl-C stops the reply, not the chat; the cut reply is not kept in the
                # conversation (the next turn rewinds to the snapshot before it).
                turns.pop()
                print("\n[reply interrupted]", file=sys.stderr)
                continue
            sys.stdout.write("\n")
            if args.stats:
                s = session.last
                print(f"[prompt {s.prompt_tokens} tokens: {s.reused_tokens} reused"
                      f"{' from a snapshot' if s.restored else ''}, {s.fed_tokens} fed; "
                      f"reply {s.reply_tokens} tokens, ended by {s.stopped_by}"
                      f"{f'; {s.target_calls} target calls, drafts accepted {s.accepted}' if args.draft else ''}]",
                      file=sys.stderr)  # fmt: skip
        if args.save_state:
            runner.snapshot().save(args.save_state)
    return 0
