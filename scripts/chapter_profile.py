#!/usr/bin/env python
"""Where a chapter's hours go (#30): from a results file of chapter 4 (or any chapter that stores `runtime` rows and
per-suite `seconds` in its `scores`), the seconds of training (per stage) and of evaluation (per suite: generation
for instructions and math, likelihood scoring for knowledge and perplexity), summed over the conditions stored;
with a second file (for example the committed results of an earlier run, `git show REV:data/results/04_vl_adaptation.json`),
the same table side by side with the ratio (`sinklib.book.costs`). Only what the results store is counted:
evaluations of conditions that the results file does not list (extra seeds, doses, sizes) are not in its `scores`.

    python scripts/chapter_profile.py data/results/04_vl_adaptation.json [BEFORE.json]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from sinklib.book.costs import profile, table


def main(argv: list[str]) -> int:
    if not argv or len(argv) > 2:
        print(__doc__)
        return 2
    after = profile(json.loads(Path(argv[0]).read_text()))
    before = profile(json.loads(Path(argv[1]).read_text())) if len(argv) == 2 else None
    print(table(after, before))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
