"""``unimodal serve``: keep the model loaded and answer agents over stdio, as JSON lines or MCP."""

from __future__ import annotations

import sys

from unimodal.cli_common import add_model_arguments
from unimodal.core.errors import InputError


def _cmd_serve(args) -> int:
    from unimodal.serve import check_model, load_pipeline, serve_stdio

    if args.stdio == args.mcp:
        raise InputError("choose one protocol: unimodal serve --mcp (Model Context Protocol over stdio, for "
                         "agents) or unimodal serve --stdio (JSON lines)")
    if args.mcp:
        from unimodal.mcp_server import require_mcp

        require_mcp()
    model_dir = check_model(args.model, args.device)
    if args.mcp:
        from unimodal.mcp_server import serve_mcp

        return serve_mcp(model_dir, args.device, out_dir=args.out_dir)
    pipe = load_pipeline(model_dir, args.device)
    print(f"unimodal serve: model {model_dir} loaded on {pipe.device}; reading JSON requests from stdin",
          file=sys.stderr, flush=True)
    return serve_stdio(pipe, model_dir=str(model_dir))


def add_serve_command(sub) -> None:
    serve = sub.add_parser("serve", help="keep the model loaded and answer agents: MCP (--mcp) or JSON lines "
                                         "(--stdio)",
                           description="unimodal serve --mcp: a Model Context Protocol server on stdin/stdout (tool "
                                       "generate; resources unimodal://vocabulary and unimodal://model). "
                                       "unimodal serve --stdio --model DIR: one JSON request per line on stdin "
                                       '({"id": 1, "op": "generate", "text": "...", "to": "image", "out": "a.png"}, '
                                       'ops: generate, ping, shutdown), one JSON response per line on stdout')
    add_model_arguments(serve)
    serve.add_argument("--stdio", action="store_true", help="talk JSON lines over stdin/stdout")
    serve.add_argument("--mcp", action="store_true", help="be a Model Context Protocol server over stdin/stdout "
                                                          "(tools: generate; resource: the known vocabulary)")
    serve.add_argument("--out-dir", default=None, help="--mcp: folder for outputs of calls that give no out "
                                                       "(default: a fresh folder under the cache)")
    serve.set_defaults(func=_cmd_serve)


__all__ = ["add_serve_command"]
