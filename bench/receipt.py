"""Receipts for benchmark results: the commit that produced them, and whether the tree was dirty.

Every results file names its code: `git` is the full 40-character commit, with "+dirty" appended
when the working tree had uncommitted changes. Results from a dirty tree are refused unless the
caller passes --allow-dirty (then they are written, and marked).

Where the identity comes from, first found wins:
  1. --git HASH[+dirty]
  2. the environment variable PROBE_SIDECAR_GIT (tests/gpu/run.sh sets it on the GPU machine,
     from what `tests/gpu/run.sh prepare` recorded here, where the checkout is)
  3. git itself, when run inside the checkout

Plain Python 3: runs here and on the GPU machine.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

_IDENTITY = re.compile(r"^[0-9a-f]{40}(\+dirty)?$")


def from_checkout(path: str | None = None) -> str | None:
    """HEAD's full hash, "+dirty" when anything (tracked or untracked, not ignored) differs."""
    cwd = path or os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=cwd, text=True,
                                       stderr=subprocess.DEVNULL).strip()
        status = subprocess.check_output(["git", "status", "--porcelain"], cwd=cwd, text=True,
                                         stderr=subprocess.DEVNULL)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if status.strip() else "")


def identify(git: str | None = None) -> str:
    """The identity of the code, or SystemExit when it cannot be known."""
    # $PROBESIDECAR_GIT: the deprecated spelling, read until the next release.
    from_env = os.environ.get("PROBE_SIDECAR_GIT", os.environ.get("PROBESIDECAR_GIT"))
    for candidate in (git, from_env, from_checkout()):
        if candidate:
            if not _IDENTITY.match(candidate):
                raise SystemExit(f"receipt: {candidate!r} is not a full 40-character commit "
                                 "(optionally with +dirty)")
            return candidate
    raise SystemExit("receipt: cannot tell which commit this is: pass --git HASH, set "
                     "PROBE_SIDECAR_GIT, or run inside the checkout")


def check(identity: str, allow_dirty: bool) -> str:
    """Refuses results from a dirty tree unless allowed; returns the identity to record."""
    if identity.endswith("+dirty") and not allow_dirty:
        raise SystemExit("receipt: the tree has uncommitted changes, so these results would not "
                         "name the code that produced them; commit first, or pass --allow-dirty "
                         "(the results are then marked +dirty)")
    return identity


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--git", default=None,
                        help="full commit of the code measured, with +dirty if the tree was dirty "
                             "(default: $PROBE_SIDECAR_GIT, else asked of git)")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="write results from a dirty tree (they are marked +dirty)")


def from_args(args: argparse.Namespace) -> str:
    return check(identify(args.git), args.allow_dirty)


if __name__ == "__main__":
    # `python3 bench/receipt.py` prints this checkout's identity (tests/gpu/run.sh prepare).
    ident = from_checkout()
    if ident is None:
        sys.exit("receipt: not a git checkout")
    print(ident)
