"""Chapter 8's causal tests (the sink intervention itself is `sinklib.core.intervene`): suites
evaluated under an intervention with dose plans and the BOS ablation (`suites`), head-wise repair of an
adapted model (`repair`), the mass-matched control matched within a tolerance (`matched`)."""
from sinklib.causal.suites import (CAUSAL_VERSION, CHAPTER8_PARAMS, CONTROLS, FIRST_TOKENS, FirstToken,
    KNOWLEDGE, STRICT, TINY_EVAL_N, TinyLM, dose_plans, dose_response, evaluate, falls, first_token_tokenizer,
    order_verdict, overlap_sentence, set_overlap, tiny_lm, paired_changes, shared_with_sink, shared_sentence,
    last_layers)
from sinklib.causal.reading import twin_sentence
from sinklib.causal.matched import TOLERANCE, flag, mass_table, match_plans, sentence as matched_sentence
