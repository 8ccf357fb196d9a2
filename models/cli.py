"""``kvdeck models ...``: the command line of the offline model pipeline.

    kvdeck models fetch MODEL [--formats nvfp4,w4a8,f16,f32] [--out DIR] [--rounding gptq|mse]
                              [--embed w8a8|f16] [--head w8a8|4bit]
    kvdeck models convert PATH [--name NAME] [--formats ...] [--out DIR] [--rounding ...] ...
    kvdeck models list
    kvdeck models check FOLDER          # validate a kvdeck model folder (config + files)

``main(argv)`` returns 0 on success, 2 on a ModelError (printed as ``kvdeck: error: ...`` on
stderr, never a traceback) or a usage error. app/__main__.py routes ``kvdeck models`` here.
"""

from __future__ import annotations

import argparse
import sys

from .errors import ModelError
from .manifest import WORD_OPTIONS

__all__ = ["main"]


def _log(msg: str) -> None:
    print(f"kvdeck: {msg}", file=sys.stderr, flush=True)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="kvdeck models", description="Fetch and convert models for kvdeck.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="download a manifest's model and convert it")
    f.add_argument("model", help="manifest name, e.g. smollm2-135m")
    f.add_argument("--formats", default=None, help="comma-separated: nvfp4,w4a8,f16,f32 (default: the manifest's)")
    f.add_argument("--out", default=None, help="output root (default: models/weights)")
    c = sub.add_parser("convert", help="convert a Hugging Face folder or a .gguf file")
    c.add_argument("path")
    c.add_argument("--name", default=None, help="model name (a manifest name picks its recipe)")
    c.add_argument("--formats", default=None)
    c.add_argument("--out", default=None)
    for a in (f, c):
        a.add_argument("--rounding", choices=WORD_OPTIONS["rounding"], default=None,
                       help="nvfp4/w4a8 rounding: gptq (error-compensating, calibration text) or mse "
                            "(round to nearest); default: the manifest's")
        a.add_argument("--embed", choices=WORD_OPTIONS["embed"], default=None,
                       help="embedding rows of nvfp4/w4a8/gguf folders; default: the manifest's")
        a.add_argument("--head", choices=WORD_OPTIONS["head"], default=None,
                       help="tied head of nvfp4/w4a8 folders; default: the manifest's")
    sub.add_parser("list", help="list the models that have a manifest")
    k = sub.add_parser("check", help="validate a kvdeck model folder")
    k.add_argument("folder")
    return ap


def _options(args) -> dict[str, str]:
    """The recipe words given on the command line (they override the manifest's)."""
    return {k: getattr(args, k) for k in WORD_OPTIONS if getattr(args, k, None)}


def main(argv: list[str]) -> int:
    """Run ``kvdeck models`` with ``argv`` (the words after "models"); returns the exit status."""
    ap = _parser()
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:  # argparse printed usage / help
        return int(e.code or 0) if e.code in (0, None) else 2
    try:
        if args.cmd == "fetch":
            from .fetch import fetch

            for p in fetch(args.model, args.formats, args.out, log=_log, options=_options(args)):
                print(p)
        elif args.cmd == "convert":
            from .fetch import convert

            for p in convert(args.path, args.name, args.formats, args.out, log=_log, options=_options(args)):
                print(p)
        elif args.cmd == "list":
            from .manifest import list_manifests, load_manifest

            for n in list_manifests():
                m = load_manifest(n)
                print(f"{m.name}\t{m.architecture}\t{m.chat_format}\t{m.tool_format}\t{m.source['kind']}")
        elif args.cmd == "check":
            from .writer import read_folder_config

            cfg = read_folder_config(args.folder)
            print(f"{args.folder}: ok: {cfg['model']} {cfg['architecture']} {cfg['weights']['format']}")
    except ModelError as e:
        print(f"kvdeck: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvdeck: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
