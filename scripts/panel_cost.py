#!/usr/bin/env python
"""The four-model panel's cost per model (#29), measured in one run on the machine it runs on: seconds per VL
stage-1 and stage-2 training step (batch 32, the 'field' phrasing; LoRA rank 16 for a model whose name ends in
'1.5b', every weight for the rest) and seconds per item of 8 instruction, 8 math and 16 knowledge items (batch 8),
with the process's peak resident memory so far (list the models from small to large and each row is its own peak). Small samples overstate the per-item cost of a whole suite (one batch, the longest
answer sets its time), so read the per-model ratios to the first model, not the absolute times.

    python scripts/panel_cost.py smollm2-135m gemma3-270m qwen2.5-coder-0.5b qwen2.5-coder-1.5b [--out FILE]

Run it alone: another job on the cores slows every row (DEVELOPING.md, the shared-cores pitfall).
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def measure(name: str) -> dict:
    from sinklib import evals, vl
    from sinklib.core import models as sm

    t0 = time.perf_counter()
    lm = sm.load_model(name)
    row = {"params (M)": sum(p.numel() for p in lm.model.parameters()) / 1e6, "load s": time.perf_counter() - t0}
    for suite, k in (("instructions", 8), ("math", 8), ("knowledge", 16)):
        row[f"{suite} s/item"] = evals.run_suite(lm.model, lm.tokenizer, suite, k, seed=0, batch_size=8).seconds / k
    method = {"lm_method": "lora", "lora_rank": 16} if name.endswith("1.5b") else {}
    res = vl.train_vl(lm.model, lm.tokenizer, stage1_steps=3, stage2_steps=3, batch_size=32, lr_lm=5e-5,
                      progress=False, phrasing="field", **method)
    for stage, key in (("stage 1", "stage1 s/step"), ("stage 2", "stage2 s/step")):
        secs = [h["seconds"] for h in res.history if stage in h["stage"]][1:]  # the first step warms up
        row[key] = sum(secs) / len(secs)
    row["peak RSS GB"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here as well")
    args = ap.parse_args(argv)
    out = {}
    for name in args.models:
        out[name] = measure(name)
        print(name, json.dumps(out[name]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
