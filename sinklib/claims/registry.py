"""The claims page: one row per claim of the paper, its reported value, ours and a verdict, all computed.

`CLAIMS` lists every claim, in the page's order; each lives in the module of the chapter whose results it reads
(``ch1_3``, ``ch4``, ``ch5_7``, ``ch6``, ``ch8``, ``ch9``; the machinery is in ``core``). ``python -m sinklib.claims`` writes
``book/_generated/claims_table.md`` with the bottom line and the other findings beside it (``sinklib.claims.findings``;
``--check`` only compares); a later chapter adds its claims to its module with
``@claim(...)`` and lists them here.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from sinklib.claims import ch1_3, ch4, ch5_7, ch6, ch8, ch9, findings
from sinklib.claims.core import Claim, default_path, evaluate, render

CLAIMS: tuple[Claim, ...] = (
    ch1_3.sink_exists,            # 1
    ch1_3.s_cheap,                # 2a
    ch1_3.s_seconds_7b,           # 2b
    ch1_3.s_stable,               # 3
    ch1_3.theorem,                # 4a
    ch5_7.remark,                 # 4b
    ch4.format_not_knowledge,     # 5a
    ch4.backbone,                 # 5b
    ch5_7.internvl35,             # 5c
    ch1_3.molmo2o,                # 5d
    ch4.coding,                   # 5e
    ch4.text_only,                # 6a
    ch4.random_change,            # 6b
    ch4.tulu,                     # 6c
    ch5_7.tiny_text_only,         # 6d
    ch5_7.predicts,               # 7a
    ch5_7.four_tasks,             # 7b
    ch5_7.rho_17,                 # 7c
    ch5_7.tiny_predicts,          # 7d
    ch5_7.tiny_beyond,            # 7e
    ch9.sink_panel_predicts,      # 7f
    ch9.sink_panel_beyond,        # 7g
    ch6.injection,                # 8a
    ch6.no_recovery,              # 8b
    ch6.most_merges_worse,        # 8c
    ch8.ablation_order,           # 9a
    ch8.repair,                   # 9b
    ch8.specific_random,          # 9c
    ch8.specific_matched,         # 9d
    ch8.first_token,              # 9e
)
#: reported keys that back no claim row, with the reason
CONTEXT_ONLY: dict[str, str] = {
    "s_last_layers": "a definition choice of S (the K that chapter 2 uses by default), not a finding",
}


def generate_all() -> dict[str, str]:
    """{file name under book/_generated: text}: the claims table, the bottom line and the other findings."""
    rows = [evaluate(c) for c in CLAIMS]
    return {"claims_table.md": render(rows), **findings.pages(rows)}


def generate() -> str:
    return generate_all()["claims_table.md"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sinklib.claims", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(default_path()), help="the claims table; the other generated passages "
                    "(bottom_line.md, other_findings.md) go beside it")
    ap.add_argument("--check", action="store_true", help="exit 1 when a file differs from what would be written")
    a = ap.parse_args(argv)
    path = Path(a.out)
    files = {(path if name == "claims_table.md" else path.parent / name): text for name, text in generate_all().items()}
    if a.check:
        stale = [p.name for p, t in files.items() if not (p.exists() and p.read_text(encoding="utf-8") == t)]
        print("claims page is fresh" if not stale else f"{', '.join(stale)} stale: run python -m sinklib.claims")
        return 1 if stale else 0
    for p, t in files.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(t, encoding="utf-8")
    print(f"wrote {', '.join(p.name for p in files)}: {len(CLAIMS)} claims")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
