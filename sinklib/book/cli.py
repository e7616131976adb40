"""``python -m sinklib.book``: the runner's commands (run, list, sync-text, set-repo; `sinklib.book.runner`)
and the book's state (`sinklib.book.stale`) and reproduction (`sinklib.book.reproduce`):

    python -m sinklib.book status                 # each chapter: current, stale, sinklib changed; time; command
    python -m sinklib.book update [--dry-run]     # re-execute the stale chapters (make book)
    python -m sinklib.book reproduce [--only 04] [--profile full] [--device auto] [--tol 1e-6] [--restart]
"""
from __future__ import annotations

import argparse
import sys

from sinklib.book import reproduce, runner, stale

COMMANDS = ("status", "update", "reproduce")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        return runner.main(argv)
    ap = argparse.ArgumentParser(prog="python -m sinklib.book", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("status", help="which executed copies are current")
    u = sub.add_parser("update", help="re-execute the stale chapters")
    u.add_argument("--dry-run", action="store_true", help="say what would run, run nothing")
    for p in (s, u):
        p.add_argument("--profile", default="full", choices=runner.PROFILE_NAMES)
    r = sub.add_parser("reproduce", help="re-execute chapters with progress, then compare with the committed results")
    r.add_argument("--only", nargs="*", help="notebook prefixes, e.g. 04 (default: every chapter)")
    r.add_argument("--profile", default="full", choices=runner.PROFILE_NAMES)
    r.add_argument("--device", default=None, help="passed to chapters that take a device (auto, cpu, cuda)")
    r.add_argument("--tol", type=float, default=reproduce.DEFAULT_TOL)
    r.add_argument("--restart", action="store_true", help="forget the chapters an interrupted run finished")
    a = ap.parse_args(argv)
    if a.cmd == "status":
        print(stale.table(stale.book_status(a.profile)))
        return 0
    from sinklib.book import carry

    if not getattr(a, "dry_run", False):
        carry.import_committed()
    if a.cmd == "update":
        stale.update(a.profile, dry_run=a.dry_run)
        return 0
    return reproduce.reproduce(a.only or None, a.profile, a.device, a.tol, a.restart)


if __name__ == "__main__":
    sys.exit(main())
