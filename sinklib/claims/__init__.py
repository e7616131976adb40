"""The claims page: one record per claim of the paper, its test computed from `data/results/`
(``python -m sinklib.claims``). The machinery is in `core`, the claims in one module per chapter's rows (`ch1_3`,
`ch4`, `ch5_7`, `ch6`, `ch8`), and `registry.CLAIMS` lists them in the page's order."""
from sinklib.claims.ch1_3 import COST_RATIO_MAX, SINK_MARGIN
from sinklib.claims.ch4 import chapter4_summary, chapter4_verdicts, models4, s_under_vl
from sinklib.claims.ch6 import (INJECT_TOP1_MIN, merge_recovers, merge_verdict, merge_worse, outcome_counts,
    undecided_reasons, vqa_not_learned)
from sinklib.claims.core import (CH4, CH5, CH6, CH7, CH8, NO_VQA, Claim, Evaluated, Results, Row, claim,
    default_path, delta, evaluate, gap, not_testable, outcomes_of, paired_change, paired_delta, paper_text, pooled,
    pooled_gap,
    per_model, render, score, strict_metrics, vqa_learned)
from sinklib.claims.registry import CLAIMS, CONTEXT_ONLY, generate, main
# the verdict vocabulary, as the claims' tests and notebooks have used it (``claims.est``, ``claims.REPRODUCED``)
from sinklib.stats.verdicts import (INCONCLUSIVE, NOT_REPRODUCED, NOT_RUN, NOT_TESTABLE, REPRODUCED, RULES, Est,
    combine, diff, direction, est, mean, wilson_pct)
