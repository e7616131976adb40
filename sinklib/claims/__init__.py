"""The claims page: one record per claim of the paper, its test computed from `data/results/`
(``python -m sinklib.claims``)."""
from sinklib.claims.table import (CH5, CH7, CH8, CLAIMS, CONTEXT_ONLY, COST_RATIO_MAX, Claim, Evaluated,
    INJECT_TOP1_MIN, NO_VQA, Results, Row, SINK_MARGIN, chapter4_summary, chapter4_verdicts, claim, default_path,
    delta, evaluate, gap, generate, main, merge_recovers, merge_worse, models4, not_testable, outcomes_of,
    paired_change, paired_delta, paper_text, per_model, render, score, vqa_learned)
