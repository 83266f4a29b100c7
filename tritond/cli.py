"""`tritond start|check|perf|analyze`: the command line. `tritond --model-repository ...` means start,
so a tritonserver command line works with only the program name changed."""
from __future__ import annotations

import argparse
import logging
import sys

import msgspec

from tritond.repository.layout import repository_problem
from tritond.repository.python_based import DEFAULT_BACKEND_DIRECTORY

from .options import UsageError, server_options, start_parser


def cmd_start(argv: list[str]) -> int:
    from tritond.process import setup_logging
    from .supervisor import Supervisor
    try:
        args = start_parser().parse_args(argv)
        opts = server_options(args)
    except UsageError as e:
        print(str(e) if str(e).startswith("Error: ") else f"tritond start: error: {e}", file=sys.stderr)
        return 1
    problems = [p for p in map(repository_problem, opts.model_repositories) if p]
    if problems and opts.exit_on_error:
        print(f"tritond start: error: {problems[0]}", file=sys.stderr)
        return 1
    if problems:
        # As tritonserver with --exit-on-error=false: the server comes up with no models and
        # answers metadata, but is neither live nor ready.
        opts = msgspec.structs.replace(opts, init_failed=problems[0], model_repositories=[])
    setup_logging(opts.log_verbose, "tritond", opts.log)
    if problems:
        logging.getLogger("tritond").error("failed to initialize: %s (serving on: --exit-on-error=false; "
                                           "the server is neither live nor ready)", problems[0])
    for level, note in opts.startup_notes:
        logging.getLogger("tritond").log(logging.getLevelName(level), "%s", note)
    sup = Supervisor(opts)
    try:
        code = sup.run()
    except BaseException:
        sup.stop_all()
        sup.cleanup()
        raise
    logging.getLogger("tritond").info("exit %d", code)
    return code


def cmd_check(argv: list[str]) -> int:
    from .check import check
    p = argparse.ArgumentParser(prog="tritond check", description="Validate model repositories.")
    p.add_argument("repositories", nargs="+")
    p.add_argument("--disable-auto-complete-config", action="store_true")
    p.add_argument("--memory", action="store_true", help="also estimate what serving them costs in memory")
    p.add_argument("--backend-directory", default=DEFAULT_BACKEND_DIRECTORY, metavar="DIR",
                   help="where Python-based backends are (<DIR>/<backend>/model.py)")
    args = p.parse_args(argv)
    return check(args.repositories, not args.disable_auto_complete_config, args.memory, args.backend_directory)


def cmd_perf(argv: list[str]) -> int:
    from .perf.cli import main as perf_main
    return perf_main(argv)


def cmd_analyze(argv: list[str]) -> int:
    from .analyze.cli import main as analyze_main
    return analyze_main(argv)


COMMANDS = {"start": cmd_start, "check": cmd_check, "perf": cmd_perf, "analyze": cmd_analyze}


def version() -> str:
    """The installed package's version and the Triton server version tritond answers with."""
    from importlib.metadata import PackageNotFoundError, version as installed
    from .frontend.metadata import SERVER_VERSION
    try:
        own = installed("tritond")
    except PackageNotFoundError:
        own = "(not installed)"
    return f"tritond {own} (Triton server protocol {SERVER_VERSION})"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("--version", "-V"):
        print(version())
        return 0
    if argv and argv[0] in COMMANDS:
        return COMMANDS[argv[0]](argv[1:])
    if argv and argv[0].startswith("--") and argv[0] not in ("--help", "-h"):
        return cmd_start(argv)
    print("usage: tritond start --model-repository DIR [options]\n"
          "       tritond check [--memory] DIR [DIR ...]\n"
          "       tritond perf -m MODEL [-u URL] [perf_analyzer's options]\n"
          "       tritond analyze -m MODEL [--repository DIR | -u URL] [objectives]\n"
          "       tritond --version\n"
          "Run 'tritond start --help' for the server options.", file=sys.stderr)
    return 0 if argv and argv[0] in ("--help", "-h") else 1


if __name__ == "__main__":
    sys.exit(main())
