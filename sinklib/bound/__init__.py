"""The perturbation bound of chapter 3: Theorem 1 and Remark 1 on tensors (`theorem`), random instances
(`instances`), the adversary's search for the worst case (`adversary`), the bound measured on real layers (`real`),
chapter 3's input-scale figure (`figures`) and its findings in words (`readings`)."""
from sinklib.bound.theorem import (CHAPTER3_PARAMS, COMPETITORS, QKSpec, VARIANTS, apply_rope,
    first_order_gap_bound, gap_change, gap_change_bound, gap_changes, logit_change_bound, norm_and_change_bounds,
    normalised_change_bound, project, qk_logits, rms_normalize, rope_gain, rope_tables, sink_gap, spectral_norm)
from sinklib.bound.instances import (DIRECTION_KINDS, Instance, check_instance, equalising_gains,
    first_order_violations, fit_loglog, gain_effect, input_scaling, flip_fractions, flip_table, layerwise_coupling,
    logit_range, null_space_query, per_head_formula_on_unnormalised, planted_sink_layer, random_direction,
    random_instance, weak_head_flips)
from sinklib.bound.adversary import adversary_note, adversary_search, random_draws, worst_direction
from sinklib.bound.figures import scale_sweep_figure
from sinklib.bound.real import (LayerQK, capture_qk_inputs, head_norms, layer_sensitivity, measure_loaded,
    measure_real_model, real_models_summary, real_scale_sweep, remark1_heads, remark1_summary, remark1_table,
    sink_norm_ratios)
from sinklib.bound.readings import norms_note, real_note, sweep_note
